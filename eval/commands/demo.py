"""``captioner demo``: the whole method end to end on the embedded synthetic dataset.

1. Generates the synthetic shapes dataset (Karpathy JSON, PNG images, COCO instances) unless it
   is already in ``OUT/synthetic-*``.
2. Encodes every image once with a frozen, randomly initialized ResNet-18 up to its stage
   ``layer3`` (no pretrained weights can be assumed offline; a random network's deeper stage
   mixes the cells too much for shapes to be told apart) and caches the float16 16 x 16 grid
   features (``captioner prepare-features``); its weights are saved beside the cache and end up
   in every checkpoint, so the checkpoints caption raw images.
3. Trains softmax, sparsemax and TVmax output-attention captioners through the same
   LightningCLI and configs as ``captioner fit`` (``configs/demo_*.yaml``; best epoch on
   val/CIDEr), into ``OUT/runs/demo_<mapping>/version_N/`` with the exact config of each run.
4. Decodes the test split from the images with each best checkpoint and scores it with the
   coco-caption metrics and REP, the share of zero attention, and the attention precision
   (share of output attention on the named shape's mask while its word is generated).
5. Writes per-word attention figures of a few test images, ``results.json`` and a table.

SPICE needs jars that ``captioner fetch-spice`` installs (the README's quickstart runs it
first); when they are absent the demo scores without SPICE and says so. SPICE scores the three
models' captions in one Java run, which loads its parser once.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from captioner.commands.options import command_parser

HELP = "train softmax / sparsemax / TVmax captioners on synthetic shapes and compare them"

MAPPINGS = ("softmax", "sparsemax", "tvmax")


@dataclass(frozen=True)
class DemoSettings:
    """Dataset and figures of one demo run, and its overrides of ``configs/demo_*.yaml``
    (command-line options of ``captioner fit``; the default run has none)."""

    n_train: int
    n_val: int
    n_test: int
    image_size: int
    n_figures: int
    spice: bool
    overrides: tuple[str, ...] = ()
    seed: int = 0


FULL = DemoSettings(n_train=500, n_val=80, n_test=100, image_size=256, n_figures=3, spice=True)
QUICK = DemoSettings(
    n_train=64, n_val=6, n_test=6, image_size=128, n_figures=1, spice=False,
    overrides=(
        "--trainer.max_epochs=4", "--data.batch_size=16", "--model.lr_decay=1.0",
        "--model.lr_decay_after=3", "--model.hidden_dim=32", "--model.feature_dim=32",
        "--model.embed_dim=16", "--model.attention_dim=16",
    ),
)
ENCODER_ARCH = "resnet18"
# Measured on the default run (softmax): layer3 gave test CIDEr 1.18 and attention precision
# 23.7%, layer4 0.95 and 15.4%.
ENCODER_LAYER = "layer3"
# The demo's configs, in the source tree (the README installs the project editable).
CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def dataset_dir(out: Path, settings: DemoSettings) -> Path:
    s = settings
    return out / f"synthetic-{s.n_train}-{s.n_val}-{s.n_test}-{s.image_size}px-seed{s.seed}"


def feature_cache_path(out: Path, settings: DemoSettings) -> Path:
    return dataset_dir(out, settings) / f"features_{ENCODER_ARCH}_{ENCODER_LAYER}.h5"


def prepare_data(out: Path, settings: DemoSettings):
    """The synthetic dataset and its ResNet-18 feature cache, made once and reused."""
    from captioner.feature_extraction import encoder_weights_path, extract_features
    from data_prep.synthetic import SyntheticDataset, generate

    root = dataset_dir(out, settings)
    try:
        dataset = SyntheticDataset.from_dir(root)
        print(f"using the synthetic dataset in {root}")
    except FileNotFoundError:
        print(f"generating the synthetic dataset in {root}")
        dataset = generate(
            root, n_train=settings.n_train, n_val=settings.n_val, n_test=settings.n_test,
            seed=settings.seed, image_size=settings.image_size, progress=True,
        )
    cache = feature_cache_path(out, settings)
    if not cache.is_file():
        extract_features(
            dataset.karpathy_json, dataset.image_root, cache, arch=ENCODER_ARCH,
            layer=ENCODER_LAYER, weights=None,
            image_size=settings.image_size, batch_size=16, num_workers=0,
            seed=settings.seed,
        )
    return dataset, cache, str(encoder_weights_path(cache).resolve())


def fit_arguments(mapping: str, dataset, cache: Path, weights: str, settings: DemoSettings,
                  out: Path) -> list[str]:
    """``captioner fit`` options that train the demo's ``mapping`` captioner: its config, the
    paths of this run's data, and the settings' overrides."""
    return [
        "--config", str(CONFIGS / f"demo_{mapping}.yaml"),
        "--data.karpathy_json", str(dataset.karpathy_json),
        "--data.image_root", str(dataset.image_root),
        "--data.feature_cache", str(cache),
        "--data.image_size", str(settings.image_size),
        "--model.encoder_weights", weights,
        "--trainer.logger.init_args.save_dir", str(out / "runs"),
        "--trainer.enable_model_summary", "false",
        "--seed_everything", str(settings.seed),
        *settings.overrides,
    ]


def train(mapping: str, dataset, cache: Path, weights: str, settings: DemoSettings,
          out: Path) -> Path:
    """Train one captioner through the same CLI and config as ``captioner fit``; returns its
    best checkpoint (copied to ``OUT/<mapping>.ckpt``)."""
    from captioner.training_cli import build_cli

    cli = build_cli(fit_arguments(mapping, dataset, cache, weights, settings, out), run=False)
    print(f"\n== training the {mapping} captioner ({cli.trainer.max_epochs} epochs)")
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    print(cli.run_summary())
    best = out / f"{mapping}.ckpt"
    shutil.copyfile(cli.best_callback.best_model_path, best)
    return best


def evaluate(checkpoint: Path, dataset, metrics: tuple[str, ...]):
    from captioner.inference import Captioner
    from eval.evaluation import evaluate_captioner

    return evaluate_captioner(
        Captioner.load(checkpoint), dataset.karpathy_json, dataset.image_root, split="test",
        instances=dataset.instances["test"], metrics=metrics,
    )


def evaluate_all(checkpoints: dict[str, Path], dataset, metrics: tuple[str, ...], out: Path):
    """Decode and score the test split with every checkpoint (SPICE aside: see :func:`score_spice`);
    writes ``captions_<mapping>.json``; returns (results, captions) keyed by mapping."""
    results: dict[str, dict[str, float]] = {}
    captions: dict[str, dict[int, str]] = {}
    for mapping, checkpoint in checkpoints.items():
        print(f"\n== decoding and scoring the test split with {mapping}")
        report = evaluate(checkpoint, dataset, tuple(m for m in metrics if m != "SPICE"))
        results[mapping] = {
            **report.metrics,
            **report.attention,
            "attention_precision": report.objects["attention_precision"],
            "object_recall": report.objects["object_recall"],
            "object_precision": report.objects["object_precision"],
        }
        captions[mapping] = {r["image_id"]: r["caption"] for r in report.results}
        (out / f"captions_{mapping}.json").write_text(json.dumps(report.results, indent=1))
    return results, captions


def load_test_split(dataset) -> list:
    """The test split's Karpathy entries (image path, id and reference captions)."""
    from data_prep.karpathy import load_karpathy

    return load_karpathy(dataset.karpathy_json, dataset.image_root).split("test")


def score_spice(entries, captions: dict[str, dict[int, str]]) -> dict[str, tuple[float, dict]]:
    """SPICE of every model's captions of the test ``entries``, in one Java run (it loads
    CoreNLP once)."""
    from eval.scoring import spice_of_systems

    return spice_of_systems(captions, {e.image_id: list(e.raws) for e in entries})


def write_figures(out: Path, entries, checkpoints: dict[str, Path], n_images: int) -> None:
    """Per-word output-attention figures of the first ``n_images`` test ``entries``, one
    folder per image and model, on one colour scale shared by all of them."""
    from captioner.heatmaps import AttentionRecord, shared_vmax, unique_stems, write_heatmaps
    from captioner.inference import Captioner
    from data_prep.images import load_image

    paths = [e.path for e in entries[:n_images]]
    captions = {
        name: Captioner.load(path).caption(paths)
        for name, path in checkpoints.items()
    }
    maps = [c.attention.numpy() for cs in captions.values() for c in cs if c.tokens]
    if not maps:
        print("notice: no attention figures, every caption is empty (an untrained model)")
        return
    vmax = shared_vmax(maps)
    for stem, path, index in zip(unique_stems(paths), paths, range(len(paths)), strict=True):
        image = load_image(path)
        for name, caps in captions.items():
            caption = caps[index]
            if not caption.tokens:
                print(f"notice: no figures of {path.name} for {name}: empty caption")
                continue
            record = AttentionRecord(str(path), caption.text, caption.tokens,
                                     caption.attention.numpy(), name, vmax)
            write_heatmaps(out / "figures" / stem / name, image, record, zero_style="white")


def format_table(results: dict[str, dict[str, float]]) -> str:
    """The paper's Table 1 columns, then zero attention and attention precision (in %)."""
    from eval.table import format_table1

    table = format_table1(results).splitlines()
    extra = (("ZeroAtt%", "zero_attention"), ("AttPrec%", "attention_precision"))
    lines = [table[0] + "".join(f"{title:>10}" for title, _ in extra)]
    for line, metrics in zip(table[1:], results.values(), strict=True):
        cells = "".join(
            f"{'nan' if math.isnan(metrics[key]) else f'{100 * metrics[key]:.1f}':>10}"
            for _, key in extra
        )
        lines.append(line + cells)
    return "\n".join(lines)


def available_metrics(spice: bool) -> tuple[str, ...]:
    """All metrics, without SPICE (and a notice) when its jars are not installed or the run
    is a quick one."""
    from eval.scoring import ALL_METRICS
    from eval.spice_jars import SpiceJarsError, locate_spice

    if not spice:
        print("notice: SPICE is skipped in a --quick run")
        return tuple(m for m in ALL_METRICS if m != "SPICE")
    try:
        locate_spice()
    except SpiceJarsError as exc:
        print(f"notice: SPICE is skipped ({exc}); run 'captioner fetch-spice' to include it")
        return tuple(m for m in ALL_METRICS if m != "SPICE")
    return ALL_METRICS


@contextmanager
def torch_threads(count: int):
    """Run the block with ``count`` torch intra-op threads, then restore the previous count."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def main(argv: list[str]) -> int:
    parser = command_parser("captioner demo", __doc__)
    parser.add_argument("--out", type=Path, default=Path("demo_out"),
                        help="output folder (default: %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny smoke run (under 2 minutes; the numbers mean nothing)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the synthetic data, the encoder and the training (default 0)")
    args = parser.parse_args(argv)
    if args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    settings = replace(QUICK if args.quick else FULL, seed=args.seed)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    metrics = available_metrics(settings.spice)
    dataset, cache, weights = prepare_data(out, settings)
    # One torch thread: the decoder's tensors are small, so thread hand-offs cost more than they
    # gain, and on a busy machine spinning threads made a training step 30x slower (0.35 s vs
    # 10 s, shared 2-core CPU). The numba kernels of TVmax keep all cores: they run a grid per
    # thread (192 ms vs 102 ms per training step of the demo on 1 and 2 cores).
    with torch_threads(1):
        checkpoints = {m: train(m, dataset, cache, weights, settings, out) for m in MAPPINGS}
        results, captions = evaluate_all(checkpoints, dataset, metrics, out)
        (out / "settings.json").write_text(json.dumps(asdict(settings), indent=2))
        # Written before SPICE and the figures, so that their failure loses no scores.
        (out / "results.json").write_text(json.dumps(results, indent=2))
        entries = load_test_split(dataset)
        if "SPICE" in metrics:
            print("\n== SPICE of the three captioners (one run)")
            for mapping, (corpus, _) in score_spice(entries, captions).items():
                results[mapping]["SPICE"] = corpus
            (out / "results.json").write_text(json.dumps(results, indent=2))
        write_figures(out, entries, checkpoints, settings.n_figures)

    minutes = (time.monotonic() - started) / 60
    print(f"\nSynthetic test split ({settings.n_test} images), beam size 3:\n")
    print(format_table(results))
    print(f"\nresults, checkpoints and figures: {out}  ({minutes:.1f} min)")
    return 0
