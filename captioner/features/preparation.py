"""The data preparations of the commands: a Karpathy JSON from photos and captions files, the
synthetic dataset rendered into a folder, and the frozen encoder's feature cache of a dataset.
torch is imported when the work starts, so that the commands' options are read at once."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

from captioner.reporting import report_error
from data_prep.importers.dataset import DEFAULT_SPLIT
from data_prep.importers.formats import FORMATS
from data_prep.importers.records import ON_ERROR as IMPORT_ON_ERROR
from data_prep.wording import names


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
    from data_prep.paths import check_output_dir
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
    from captioner.features.extraction import extract_features
    from captioner.model.devices import resolve_device
    from captioner.model.encoder import EncoderWeightsError

    prog = "captioner prepare-features"
    try:
        split_names = tuple(names("split")(splits))
    except ValueError as exc:
        return report_error(prog, exc, "--splits")
    try:
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
    except (ValueError, OSError, EncoderWeightsError) as exc:
        return report_error(prog, exc)
    print(f"feature cache {out} (encoder: {config})")
    from captioner.features.next_steps import fit_command, machine_setup

    print("next:")
    print(f"  {fit_command(machine_setup().config, data, images, out, config)}")
    return 0


def check_sources(captions: list[Path], images: list[Path]) -> None:
    """ValueError unless every captions file has its image folder."""
    from data_prep.wording import counted

    if len(captions) != len(images):
        raise ValueError(f"{counted(len(captions), '--captions file')} but "
                         f"{counted(len(images), '--images folder')}: give each captions file "
                         "its image folder (--captions A --images DIR_A --captions B --images "
                         "DIR_B)")


def prepare_dataset(
    captions: list[Path],
    images: list[Path],
    out: Path,
    overwrite: bool = False,
    format: Literal[FORMATS] = "auto",
    split: str = DEFAULT_SPLIT,
    seed: int = 0,
    on_error: Literal[IMPORT_ON_ERROR] = "skip",
    name: str | None = None,
    progress: bool = True,
) -> int:
    """Make a Karpathy-split JSON file from image folders and their captions files, say what
    was skipped, and print the commands that go on from it; the exit status: 0, or 2 for a user
    error (one line).

    Args:
        captions: captions file; repeated, one per image folder.
        images: image folder of the --captions before it; the captions' image paths are
            relative to it.
        out: Karpathy JSON file to write.
        overwrite: replace an existing --out file (default: refuse it).
        format: captions file format (auto: from the extension and content).
        split: train,val,test fractions or counts, or a JSON split file.
        seed: seed of random splits.
        on_error: skip bad items and list them, or stop at the first in file order (exit 2).
        name: 'dataset' field (default: the output file name without 'dataset_' and '.json').
        progress: show the progress bar.
    """
    from data_prep.importers.dataset import ImportOptions, Source, import_dataset
    from data_prep.importers.records import DatasetImportError

    prog = "captioner prepare-dataset"
    images = [Path(folder) for folder in images]
    try:
        check_sources(captions, images)
        options = ImportOptions(
            sources=tuple(Source(Path(file), folder)
                          for file, folder in zip(captions, images, strict=True)),
            out=Path(out), fmt=format, split=split, seed=seed, on_error=on_error, name=name,
            overwrite=overwrite)
        report = import_dataset(options, progress=progress)
    except (DatasetImportError, OSError, ValueError) as exc:
        return report_error(prog, exc)
    _tell_import(report, len(options.sources), images)
    _print_next_steps(Path(out), report.image_root)
    return 0


def _tell_import(report, sources: int, images: list[Path]) -> None:
    """What an import wrote (stdout) and skipped, left out or did not use (stderr)."""
    from data_prep.importers.records import REASONS
    from data_prep.wording import agreeing, counted, first_names

    prog = "captioner prepare-dataset"
    print(f"wrote {report.out} (dataset {report.name!r}, captions read as {report.fmt})")
    if sources > 1:
        print(f"  image root: {report.image_root} (the images' paths are relative to it)")
    for split, count in report.images.items():
        print(f"  {split + ':':<6} {counted(count, 'image')}, "
              f"{counted(report.captions[split], 'caption')}")
    for reason, problems in report.problems.items():
        listed = first_names([problem.item for problem in problems])
        print(f"{prog}: skipped {len(problems)} ({REASONS[reason]}): {listed}\n"
              f"  e.g. {problems[0].skipped}", file=sys.stderr)
    if report.left_out:
        print(f"{prog}: left out {counted(len(report.left_out), 'usable image')} beyond the "
              f"--split counts: {first_names(report.left_out)}", file=sys.stderr)
    if report.uncaptioned:
        count = len(report.uncaptioned)
        folders = ", ".join(map(str, images))
        print(f"{prog}: note: {counted(count, 'image')} in {folders} "
              f"{agreeing(count, 'has', 'have')} no captions and "
              f"{agreeing(count, 'was', 'were')} not used: {first_names(report.uncaptioned)}",
              file=sys.stderr)


def _print_next_steps(out: Path, images: Path) -> None:
    from captioner.features.next_steps import (
        CPU_SETUP,
        cache_path,
        fit_command,
        machine_setup,
        prepare_features_command,
        setup_encoder,
    )

    setup = machine_setup()
    cache = cache_path(out, setup.arch, setup.layer)
    print("next" + (" (no GPU here: the small CPU config)" if setup is CPU_SETUP else "") + ":")
    print(f"  {prepare_features_command(out, images, setup)}")
    print(f"  {fit_command(setup.config, out, images, cache, setup_encoder(setup))}")
    print(f"(where {setup.weights} cannot be downloaded: prepare-features --weights none, a "
          "random encoder whose captions barely depend on the image; it prints the fit command "
          "for its cache)")
