"""``captioner prepare-features``: encode every image once with a frozen ResNet and cache the
float16 grid features (HDF5, keyed by image id) for training with a frozen encoder.

    captioner prepare-features --data data/coco/dataset_coco.json --images data/coco/images \\
        --arch resnet101 --weights IMAGENET1K_V2 --out data/coco/features_resnet101.h5

The cache records the encoder configuration (arch, layer, weights, image size); training checks it
against the model's encoder. With ``--weights none`` the encoder is randomly initialized and
its batch-norm statistics are estimated on a few training images (a random network's features
are far more informative with normalized activations: on the synthetic demo data, validation
CIDEr 0.96 instead of 0.57 after the same training, measured). Those weights are saved beside
the cache (``NAME.encoder.pt``) and that file is recorded as the weights, so that a model
trained on the cache loads the very encoder that produced it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from captioner.commands.caption import DEVICE_HELP

HELP = "cache frozen-encoder grid features (float16, HDF5) for the images of a Karpathy JSON"


def encoder_weights_path(cache_path: str | Path) -> Path:
    """Where the weights of a randomly initialized encoder are saved for ``cache_path``."""
    cache_path = Path(cache_path)
    return cache_path.with_name(f"{cache_path.stem}.encoder.pt")


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
) -> dict:
    """Encode the images of ``splits`` with the ResNet ``arch`` up to stage ``layer`` and write
    the cache ``out``; returns the encoder dict recorded in it (``arch``, ``layer``,
    ``weights``, ``image_size``, ``init``).

    ``weights=None``: random initialization (``seed``) with batch-norm statistics estimated on
    the first ``calibration_images`` training images, saved to :func:`encoder_weights_path`.
    """
    import torch
    from torch.utils.data import DataLoader
    from tqdm.auto import tqdm

    from captioner.checkpointing import save_atomically
    from captioner.data import CaptionImages, ImageInputs, collate_images
    from captioner.model.encoder import build_encoder
    from data_prep.features import FeatureCacheWriter
    from data_prep.karpathy import load_karpathy

    out = Path(out)
    dataset = load_karpathy(karpathy_json, image_root)
    entries, seen = [], set()
    for split in splits:
        for entry in dataset.split(split):
            if entry.image_id not in seen:
                seen.add(entry.image_id)
                entries.append(entry)
    if not entries:
        raise ValueError(f"{karpathy_json}: no images in the splits {', '.join(splits)}")

    init = "loaded weights"
    if weights is None:
        # Random weights are saved so that the model can rebuild the same encoder.
        resnet = _calibrated_random_resnet(
            arch, dataset.split("train")[:calibration_images], image_size, seed
        )
        weights_file = encoder_weights_path(out).resolve()
        save_atomically(resnet.state_dict(), weights_file)
        weights = str(weights_file)
        init = f"random (seed {seed}), batch-norm statistics of {calibration_images} images"
    encoder = build_encoder(arch, weights=weights, trainable=False, layer=layer).to(device).eval()
    config = {
        "arch": arch, "layer": layer, "weights": weights, "image_size": image_size, "init": init
    }

    loader = DataLoader(
        CaptionImages(entries, ImageInputs(image_size)),
        batch_size=batch_size,
        num_workers=num_workers,
        collate_fn=collate_images,
    )
    grid = _grid(encoder, image_size, device)
    with (
        FeatureCacheWriter(out, grid=grid, channels=encoder.channels, encoder=config) as writer,
        torch.no_grad(),
        tqdm(total=len(entries), desc=f"{arch} features", unit="img", disable=not progress) as bar,
    ):
        for batch in loader:
            features = encoder(batch["inputs"].to(device))
            writer.add(batch["image_ids"].tolist(), features.half().cpu().numpy())
            bar.update(len(batch["image_ids"]))
    return config


def _calibrated_random_resnet(arch: str, entries, image_size: int, seed: int):
    """A randomly initialized torchvision ResNet whose batch-norm running statistics are the
    exact mean and variance of its activations on ``entries``' images (no gradient step)."""
    import torch
    import torchvision

    from captioner.data import CaptionImages, ImageInputs, collate_images

    if not entries:
        raise ValueError("random encoder initialization needs training images for batch norm")
    torch.manual_seed(seed)
    resnet = torchvision.models.get_model(arch, weights=None)
    for module in resnet.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.reset_running_stats()
            module.momentum = None  # cumulative average over all calibration batches
    images = CaptionImages(entries, ImageInputs(image_size))
    resnet.train()
    with torch.no_grad():
        for start in range(0, len(images), 16):
            batch = [images[i] for i in range(start, min(start + 16, len(images)))]
            resnet(collate_images(batch)["inputs"])
    return resnet.eval()


def _grid(encoder, image_size: int, device: str) -> tuple[int, int]:
    import torch

    with torch.no_grad():
        probe = encoder(torch.zeros(1, 3, image_size, image_size, device=device))
    return int(probe.shape[1]), int(probe.shape[2])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="captioner prepare-features", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, type=Path, help="Karpathy-split JSON file")
    parser.add_argument("--images", required=True, type=Path, help="image root folder")
    parser.add_argument("--out", required=True, type=Path, help="HDF5 cache file to write")
    parser.add_argument("--arch", default="resnet101", help="ResNet depth (default: resnet101)")
    parser.add_argument(
        "--layer",
        default="layer4",
        help="last ResNet stage kept: layer4 (stride 32, the paper) or layer3 (stride 16)",
    )
    parser.add_argument(
        "--weights",
        default="IMAGENET1K_V2",
        help="torchvision weights name, a local state_dict file, or 'none' (random init)",
    )
    parser.add_argument("--image-size", type=int, default=256)
    parser.add_argument("--splits", default="train,val,test", help="comma-separated splits")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--device", default=None, help=DEVICE_HELP)
    parser.add_argument("--seed", type=int, default=0, help="random-init seed (--weights none)")
    args = parser.parse_args(argv)

    from captioner.inference import resolve_device

    weights = None if args.weights.lower() == "none" else args.weights
    config = extract_features(
        args.data,
        args.images,
        args.out,
        arch=args.arch,
        layer=args.layer,
        weights=weights,
        image_size=args.image_size,
        splits=tuple(s.strip() for s in args.splits.split(",") if s.strip()),
        batch_size=args.batch_size,
        num_workers=args.num_workers,
        device=str(resolve_device(args.device)),
        seed=args.seed,
    )
    print(f"wrote {args.out} (encoder: {config})")
    return 0
