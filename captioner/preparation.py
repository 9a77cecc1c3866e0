"""The data preparations of the commands: the synthetic dataset rendered into a folder, and
the frozen encoder's feature cache of a dataset. torch is imported when the work starts, so
that the commands' options are read at once."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Literal

from captioner.commands.options import names, report_error


def render_synthetic(
    out: Path,
    train: int = 2000,
    val: int = 250,
    test: int = 250,
    seed: int = 0,
    image_size: int = 256,
    progress: bool = True,
) -> int:
    """Render scenes of 1-3 coloured shapes on textured backgrounds with five captions each,
    as a Karpathy-split JSON file, PNG images and COCO instance annotations, and print their
    paths; the exit status: 0, or 2 for a user error (one line). The output depends only on
    the seed, the split sizes and the image size.

    Args:
        out: output folder (created if needed).
        train: training images.
        val: validation images.
        test: test images.
        seed: random seed.
        image_size: side of the square images in pixels.
        progress: show the progress bar.
    """
    from data_prep.files import check_output_dir
    from data_prep.synthetic import generate

    try:
        check_output_dir(out)
        dataset = generate(out, n_train=train, n_val=val, n_test=test, seed=seed,
                           image_size=image_size, progress=progress)
    except ValueError as exc:
        return report_error("captioner prepare-synthetic", exc)
    rows = [("Karpathy split file", dataset.karpathy_json), ("image root", dataset.image_root)]
    rows += [(f"instances ({split})", path) for split, path in dataset.instances.items()]
    for label, path in rows:
        print(f"{label + ':':<22}{path}")
    return 0


def default_workers() -> int:
    """Image-reading worker processes of a feature extraction: 2, or 1 where only one CPU is
    usable (torch warns when there are more loader processes than CPUs to run them)."""
    from data_prep.machine import usable_cpus

    return min(2, usable_cpus())


def prepare_feature_cache(
    data: Path,
    images: Path,
    out: Path,
    arch: str = "resnet101",
    layer: str = "layer4",
    weights: str = "IMAGENET1K_V2",
    image_size: int = 256,
    splits: str = "train,val,test",
    batch_size: int = 32,
    num_workers: int | None = None,
    device: str | None = None,
    seed: int = 0,
    on_error: Literal["fail", "skip"] = "fail",
    progress: bool = True,
) -> int:
    """Encode every image of a Karpathy JSON once with a frozen ResNet into an HDF5 feature
    cache, then print the fit command that trains on it; the exit status: 0, 2 for a user
    error (one line), 130 on Ctrl-C (the same call continues).

    Args:
        data: Karpathy-split JSON file.
        images: image root folder.
        out: HDF5 cache file to write.
        arch: ResNet depth.
        layer: last ResNet stage kept: layer4 (stride 32, the paper) or layer3 (stride 16).
        weights: torchvision weights name, a local state_dict file, or 'none' (random init).
        image_size: images are resized to this many pixels square.
        splits: comma-separated splits.
        batch_size: images per batch.
        num_workers: image-reading worker processes (default: 2, or 1 where only one CPU is
            usable).
        device: torch device: cpu, cuda, cuda:1, ... (default: cuda when available, else cpu).
        seed: random-init seed, with --weights none.
        on_error: unusable images: fail lists them all and stops before encoding; skip encodes
            the others and records the skipped ones.
        progress: show progress bars.
    """
    from captioner.feature_extraction import extract_features
    from captioner.inference import resolve_device
    from captioner.model.encoder import EncoderWeightsError

    prog = "captioner prepare-features"
    try:
        split_names = tuple(names("split")(splits))
        config = extract_features(
            data, images, out, arch=arch, layer=layer,
            weights=None if weights.lower() == "none" else weights, image_size=image_size,
            splits=split_names, batch_size=batch_size,
            num_workers=default_workers() if num_workers is None else num_workers,
            device=str(resolve_device(device)), seed=seed, progress=progress,
            on_error=on_error, log=print)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; run the same command again to continue from the images "
              "already encoded", file=sys.stderr)
        return 130
    except argparse.ArgumentTypeError as exc:
        return report_error(prog, ValueError(f"--splits: {exc}"))
    except (ValueError, OSError, EncoderWeightsError) as exc:
        return report_error(prog, exc)
    print(f"feature cache {out} (encoder: {config})")
    from captioner.commands.next_steps import fit_command, machine_setup

    print("next:")
    print(f"  {fit_command(machine_setup().config, data, images, out, config)}")
    return 0
