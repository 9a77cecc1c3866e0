"""The steps of ``captioner demo`` (eval/commands/demo.py says what it does, in order): the
synthetic data and its pretrained encoder and feature cache, the captioners trained through the
same CLI as ``captioner fit``, their scores over seeds, the figures and the gallery.

Everything is written into one output folder ``out``; :func:`run_demo` runs the steps in order.
"""

from __future__ import annotations

import json
import math
import shutil
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from captioner import CONFIGS
from captioner.features.pretraining_settings import PretrainingSettings, describe_accuracy
from data_prep.atomic import write_json
from data_prep.hashes import file_sha256
from data_prep.synthetic import SyntheticDataset
from data_prep.wording import counted, first_names
from eval.demo.trainings import FILE_NAME as TRAININGS_FILE

MAPPINGS = ("softmax", "sparsemax", "tvmax")


@dataclass(frozen=True)
class DemoSettings:
    """Dataset, encoder pretraining and figures of one demo run, and its overrides of
    ``configs/demo_*.yaml`` (command-line options of ``captioner fit``; the default run has
    none)."""

    n_train: int
    n_val: int
    n_test: int
    image_size: int
    n_figures: int
    n_gallery: int
    spice: bool
    pretraining: PretrainingSettings
    overrides: tuple[str, ...] = ()
    seed: int = 0


ENCODER_ARCH = "resnet18"
# layer3: a 16 x 16 grid at 256 px, for objects of 44-110 px. Chosen with the earlier random
# encoder (softmax, test CIDEr 1.18 and attention precision 23.7% against 0.95 and 15.4% with
# layer4's 8 x 8 grid); not measured again with the pretrained one.
ENCODER_LAYER = "layer3"
FULL = DemoSettings(
    n_train=500, n_val=80, n_test=100, image_size=256, n_figures=3, n_gallery=20,
    spice=True,
    pretraining=PretrainingSettings(arch=ENCODER_ARCH, layer=ENCODER_LAYER, image_size=256),
)
QUICK = DemoSettings(
    n_train=64, n_val=6, n_test=6, image_size=128, n_figures=1, n_gallery=2,
    spice=False,
    pretraining=PretrainingSettings(arch=ENCODER_ARCH, layer=ENCODER_LAYER, image_size=128,
                                    crop=64, epochs=1),
    overrides=(
        "--trainer.max_epochs=4", "--data.batch_size=16", "--model.lr_decay=1.0",
        "--model.lr_decay_after=3", "--model.hidden_dim=32", "--model.feature_dim=32",
        "--model.embed_dim=16", "--model.attention_dim=16",
    ),
)


@dataclass(frozen=True)
class DemoData:
    """The synthetic dataset, its feature cache and the encoder weights that made it."""

    dataset: SyntheticDataset
    cache: Path
    weights: Path
    encoder_sha256: str
    encoder_report: dict


def dataset_dir(out: Path, settings: DemoSettings) -> Path:
    s = settings
    return out / f"synthetic-{s.n_train}-{s.n_val}-{s.n_test}-{s.image_size}px-seed{s.seed}"


def encoder_path(out: Path, settings: DemoSettings) -> Path:
    return dataset_dir(out, settings) / f"encoder_{ENCODER_ARCH}_{ENCODER_LAYER}.pt"


def feature_cache_path(out: Path, settings: DemoSettings) -> Path:
    return dataset_dir(out, settings) / f"features_pretrained_{ENCODER_ARCH}_{ENCODER_LAYER}.h5"


def prepare_data(out: Path, settings: DemoSettings) -> DemoData:
    """The synthetic dataset, its pretrained encoder and feature cache, made once and reused
    (the encoder again when its recorded settings are not those of this run, or its file
    cannot be read).

    Raises:
        ValueError: a dataset file of an earlier run that cannot be read, naming it and the
            folder to remove so that the data is made again.
    """
    from captioner.features.extraction import extract_features
    from captioner.features.pretraining import pretrain_encoder
    from captioner.model.encoder import EncoderWeightsError, build_encoder, pretraining_report_path
    from data_prep.features import partial_cache_path
    from data_prep.karpathy import KarpathyFormatError, load_karpathy
    from data_prep.synthetic import generate

    root = dataset_dir(out, settings)
    try:
        dataset = SyntheticDataset.from_dir(root)
        print(f"using the synthetic dataset in {root}")
        load_karpathy(dataset.karpathy_json, dataset.image_root)
    except KarpathyFormatError as exc:
        raise ValueError(f"{exc}; remove {root} to make the demo's data again") from None
    except FileNotFoundError:
        print(f"generating the synthetic dataset in {root}")
        dataset = generate(
            root, n_train=settings.n_train, n_val=settings.n_val, n_test=settings.n_test,
            seed=settings.seed, image_size=settings.image_size, progress=True,
        )
    weights, cache = encoder_path(out, settings), feature_cache_path(out, settings)
    pretraining = replace(settings.pretraining, seed=settings.seed)
    report = _read_report(pretraining_report_path(weights))
    remake = not weights.is_file() or {k: report.get(k) for k in asdict(pretraining)} != asdict(
        pretraining)
    if not remake:
        try:
            build_encoder(ENCODER_ARCH, weights, layer=ENCODER_LAYER)
        except EncoderWeightsError as exc:
            print(f"the earlier run's encoder cannot be read ({exc}): made again")
            remake = True
    if remake:
        print("\n== pretraining the encoder on the training split's cells "
              f"({counted(pretraining.epochs, 'epoch')})")
        for made_by_an_earlier_encoder in (cache, partial_cache_path(cache)):
            made_by_an_earlier_encoder.unlink(missing_ok=True)
        report = pretrain_encoder(dataset.karpathy_json, dataset.image_root, dataset.instances,
                                  weights, pretraining)
    print(describe_accuracy(report))
    if not cache.is_file():
        extract_features(
            dataset.karpathy_json, dataset.image_root, cache, arch=ENCODER_ARCH,
            layer=ENCODER_LAYER, weights=str(weights.resolve()), image_size=settings.image_size,
            batch_size=16, num_workers=0,
        )
    return DemoData(dataset, cache, weights.resolve(), file_sha256(weights), report)


def _read_report(path: Path) -> dict:
    """A pretraining report, or {} when it is missing or unreadable (the encoder is remade)."""
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return report if isinstance(report, dict) else {}


def fit_arguments(mapping: str, data: DemoData, settings: DemoSettings, out: Path,
                  seed: int, extra: tuple[str, ...] = ()) -> list[str]:
    """``captioner fit`` options that train the demo's ``mapping`` captioner with ``seed``: its
    config, the paths of this run's data, the settings' overrides and ``extra`` ones."""
    return [
        "--config", str(CONFIGS / f"demo_{mapping}.yaml"),
        "--data.karpathy_json", str(data.dataset.karpathy_json),
        "--data.image_root", str(data.dataset.image_root),
        "--data.feature_cache", str(data.cache),
        "--data.image_size", str(settings.image_size),
        "--model.encoder_weights", str(data.weights),
        "--trainer.logger.init_args.save_dir", str(out / "runs"),
        "--trainer.enable_model_summary", "false",
        "--seed_everything", str(seed),
        *settings.overrides,
        *extra,
    ]


def train(mapping: str, data: DemoData, settings: DemoSettings, out: Path, seed: int,
          extra: tuple[str, ...] = ()) -> tuple[Path, float]:
    """Train one captioner through the same CLI and config as ``captioner fit``, unless the
    run's :class:`~eval.demo.trainings.TrainingRecord` holds a finished training of the same
    resolved config and encoder; returns its best checkpoint and that checkpoint's val/CIDEr."""
    from captioner.training.cli import build_cli
    from data_prep.stop_signals import stops_as_keyboard_interrupt
    from eval.demo.trainings import Training, TrainingRecord

    cli = build_cli(fit_arguments(mapping, data, settings, out, seed, extra), run=False)
    config = cli.parser.dump(cli.config)
    record = TrainingRecord(out)
    finished = record.find(config, data.encoder_sha256)
    which = f"the {mapping} captioner, seed {seed}" + "".join(f", {option}" for option in extra)
    if finished is not None:
        print(f"\n== {which}: trained already, {finished.checkpoint} (val/CIDEr "
              f"{finished.val_CIDEr:.4f})")
        return Path(finished.checkpoint), finished.val_CIDEr
    print(f"\n== training {which} ({counted(cli.trainer.max_epochs, 'epoch')})")
    with stops_as_keyboard_interrupt(cli.trainer):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    print(cli.run_summary())
    best = cli.best_callback
    checkpoint, score = Path(best.best_model_path), float(best.best_model_score)
    record.add(Training(config, data.encoder_sha256, str(checkpoint), score))
    return checkpoint, score


# The lock file of the demo running in --out (eval/commands/demo.py): neither a result nor
# another's file.
LOCK_NAME = ".demo.lock"
# What a demo run writes into --out beside its data (OUT/synthetic-*) and OUT/runs (kept: run
# versions add up, and each holds the config it trained with).
RESULT_PATTERNS = ("results.json", "metrics.png", "gallery", "figures", "*.ckpt",
                   "captions_*.json", TRAININGS_FILE)
# The last result a run writes (run_demo): a folder without it holds a run stopped before its
# end, which the same command goes on from.
FINISHED_MARK = "metrics.png"


def earlier_results(out: Path) -> list[str]:
    """The names of the results of an earlier run in ``out``, sorted (``--overwrite`` removes
    them with :func:`data_prep.output_folders.clear_folder`): a new run must not mix its figures and
    gallery with them, nor replace them unasked.

    Raises:
        ValueError: ``out`` also holds files that are not the demo's (it is never emptied)."""
    if not out.is_dir():
        return []
    names = sorted(entry.name for entry in out.iterdir() if entry.name != LOCK_NAME)
    ours = {name for name in names if any(Path(name).match(p) for p in RESULT_PATTERNS)}
    if TRAININGS_FILE not in ours:
        # The record comes with the first captioner trained, before any other result: without
        # it, a model.ckpt or a figures/ folder is the user's, whatever its name.
        ours = set()
    foreign = [name for name in names
               if name not in ours and name != "runs" and not name.startswith("synthetic-")]
    if foreign:
        raise ValueError(f"{out}: holds files that are not the demo's "
                         f"({first_names(foreign, 3)}); choose a new or empty folder")
    inside = _foreign_in_folders(out, ours)
    if inside:  # which clearing the demo's folders would delete
        raise ValueError(f"{out}: holds files that are not the demo's inside its results "
                         f"({first_names(inside, 3)}); move them out, or choose a new or "
                         "empty folder")
    return sorted(ours)


def _foreign_in_folders(out: Path, ours: set[str]) -> list[str]:
    """The entries inside the result folders of ``ours`` (``gallery``, ``figures``) that the
    demo did not write: the gallery's as its page lists them, the figures' by their names
    (``figures/STEM/MAPPING/`` holds what ``write_heatmaps`` writes)."""
    from captioner.inference.heatmaps import is_heatmaps_file
    from data_prep.output_folders import foreign_entries
    from eval.gallery import gallery_files

    found = []
    if "gallery" in ours and (out / "gallery").is_dir():
        gallery = out / "gallery"
        found += [f"gallery/{name}" for name in foreign_entries(gallery, gallery_files(gallery))]
    if "figures" in ours and (out / "figures").is_dir():
        figures = out / "figures"
        drawn = {path.relative_to(figures).as_posix() for path in figures.glob("*/*/*")
                 if path.parent.name in MAPPINGS and path.is_file()
                 and is_heatmaps_file(path.name)}
        found += [f"figures/{name}" for name in foreign_entries(figures, drawn)]
    return found


def seed_suffix(seed: int, seeds: list[int]) -> str:
    """What the names of a seed's checkpoints and captions files add to the mapping: nothing
    for the first seed (``tvmax.ckpt``, the one the figures and the README use), ``_seed<k>``
    for the others (``tvmax_seed1.ckpt``)."""
    return "" if seed == seeds[0] else f"_seed{seed}"


def choose_lam(grid: list[float], data: DemoData, settings: DemoSettings, out: Path,
               seed: int) -> tuple[float, dict[float, float], Path]:
    """Train TVmax with every lambda of ``grid`` (``seed``) and keep the best on val/CIDEr, the
    paper's rule; returns (chosen lambda, {lambda: val/CIDEr}, the chosen model's checkpoint)."""
    scores: dict[float, float] = {}
    checkpoints: dict[float, Path] = {}
    for lam in grid:
        checkpoints[lam], scores[lam] = train(
            "tvmax", data, settings, out, seed, (f"--model.output_attention_kwargs.lam={lam}",))
    chosen = max(grid, key=lambda lam: scores[lam])
    print("\nTVmax lambda on the validation split (val/CIDEr): "
          + ", ".join(f"{lam:g}: {score:.3f}" for lam, score in scores.items())
          + f"; chosen {chosen:g}")
    return chosen, scores, checkpoints[chosen]


def evaluate(checkpoint: Path, dataset, metrics: tuple[str, ...]):
    from captioner.inference.pipeline import Captioner
    from eval.evaluation import evaluate_captioner

    return evaluate_captioner(
        Captioner.load(checkpoint), dataset.karpathy_json, dataset.image_root, split="test",
        instances=dataset.instances["test"], metrics=metrics,
    )


def evaluate_all(checkpoints: dict[str, Path], dataset, metrics: tuple[str, ...], out: Path,
                 suffix: str = ""):
    """Decode and score the test split with every checkpoint (SPICE aside: see :func:`score_spice`);
    writes ``captions_<mapping><suffix>.json``; returns (results, captions) keyed by mapping."""
    results: dict[str, dict[str, float]] = {}
    captions: dict[str, dict[int, str]] = {}
    for mapping, checkpoint in checkpoints.items():
        print(f"\n== decoding and scoring the test split with {checkpoint.name}")
        report = evaluate(checkpoint, dataset, tuple(m for m in metrics if m != "SPICE"))
        results[mapping] = {**report.metrics, **report.attention, **report.objects}
        captions[mapping] = {r["image_id"]: r["caption"] for r in report.results}
        (out / f"captions_{mapping}{suffix}.json").write_text(json.dumps(report.results, indent=1))
    return results, captions


def load_test_split(dataset) -> list:
    """The test split's Karpathy entries (image path, id and reference captions)."""
    from data_prep.karpathy import load_karpathy

    return load_karpathy(dataset.karpathy_json, dataset.image_root).split("test")


def score_spice(entries, captions: dict[str, dict[int, str]]) -> dict[str, tuple[float, dict]]:
    """SPICE of every model's captions of the test ``entries``, in one Java run (it loads
    CoreNLP once)."""
    from eval.metrics.scoring import spice_of_systems

    return spice_of_systems(captions, {e.image_id: list(e.raws) for e in entries})


def write_figures(out: Path, entries, captioners: dict, n_images: int) -> None:
    """Per-word output-attention figures of the first ``n_images`` test ``entries`` by every
    `captioner.inference.pipeline.Captioner` of ``captioners`` (keyed by mapping), one folder per
    image
    and model, on one colour scale shared by all of them."""
    from captioner.inference.heatmaps import (
        AttentionRecord,
        shared_vmax,
        unique_stems,
        write_heatmaps,
    )
    from data_prep.images import load_image

    paths = [e.path for e in entries[:n_images]]
    captions = {name: captioner.caption(paths) for name, captioner in captioners.items()}
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


def write_gallery(out: Path, entries, captioners: dict, n_images: int) -> Path | None:
    """``OUT/gallery/index.html``: the first ``n_images`` test ``entries`` captioned by every
    `captioner.inference.pipeline.Captioner` of ``captioners`` (keyed by mapping) side by side, one
    attention overlay per word (``captioner gallery``); None, with a notice, when every
    caption is empty."""
    from eval.gallery import GalleryModel, build_gallery, caption_gallery

    images, failed = caption_gallery(
        list(captioners.values()), [c.decoding for c in captioners.values()],
        [e.path for e in entries[:n_images]], names=[e.path.name for e in entries[:n_images]],
    )
    if failed:  # the demo's own images: unreadable ones mean a damaged output folder
        raise OSError(f"cannot read {', '.join(map(str, failed))}")
    if not any(c.tokens for item in images for c in item.captions):
        print("notice: no gallery, every caption is empty (an untrained model)")
        return None
    models = [GalleryModel(mapping, str(captioner.checkpoint), mapping)
              for mapping, captioner in captioners.items()]
    return build_gallery(out / "gallery", images, models, zero_style="white",
                         title="captioner demo: synthetic test images")


def available_metrics(spice: bool) -> tuple[str, ...]:
    """All metrics, without SPICE (and a notice) when its jars are not installed or the run
    is a quick one."""
    from eval.metrics.scoring import ALL_METRICS
    from eval.metrics.spice_jars import SpiceJarsError, locate_spice

    if not spice:
        print("notice: SPICE is skipped in a --quick run")
        return tuple(m for m in ALL_METRICS if m != "SPICE")
    try:
        locate_spice()
    except SpiceJarsError as exc:
        print(f"notice: SPICE is skipped: {exc}")  # the error says to run fetch-spice
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


@dataclass(frozen=True)
class DemoOutcome:
    """What a demo run reports: every seed's metrics per mapping (``per_seed[seed][mapping]
    [metric]``), the table's title, and the figure and gallery it wrote (no gallery when every
    caption is empty), and how long it took."""

    per_seed: dict[int, dict[str, dict[str, float]]]
    title: str
    figure: Path
    gallery: Path | None


def run_demo(out: Path, data: DemoData, settings: DemoSettings, seeds: list[int],
             lam_grid: list[float] | None = None) -> DemoOutcome:
    """Run the demo's steps after :func:`prepare_data` into the folder ``out`` (made, and
    cleared of earlier results, by the caller) on ``data``: captioners of every mapping
    trained once per seed of ``seeds``, TVmax with the lambda of ``lam_grid`` that is best on
    the validation split when given."""
    from captioner.inference.pipeline import Captioner
    from eval.demo.metrics_figure import plot_seed_metrics
    from eval.table import undefined_for_some_seeds

    metrics = available_metrics(settings.spice)
    summary: dict = {"settings": asdict(settings), "seeds": seeds,
                     "encoder_val_cell_accuracy": data.encoder_report["val_cell_accuracy"]}
    # One torch thread: the decoder's tensors are small, so thread hand-offs cost more than they
    # gain, and on a busy machine spinning threads made a training step 30x slower (0.35 s vs
    # 10 s, shared 2-core CPU). The numba kernels of TVmax keep all cores: they run a grid per
    # thread (192 ms vs 102 ms per training step of the demo on 1 and 2 cores).
    with torch_threads(1):
        grid_checkpoint, tvmax_extra = None, ()
        if lam_grid:
            lam, scores, grid_checkpoint = choose_lam(lam_grid, data, settings, out, seeds[0])
            summary["lam_selection"] = {"val_CIDEr": {f"{k:g}": v for k, v in scores.items()},
                                        "chosen": lam}
            tvmax_extra = (f"--model.output_attention_kwargs.lam={lam}",)
        trained: dict[int, dict[str, Path]] = {seed: {} for seed in seeds}
        for seed in seeds:
            for mapping in MAPPINGS:
                if mapping == "tvmax" and seed == seeds[0] and grid_checkpoint is not None:
                    best = grid_checkpoint  # the grid's model of the chosen lambda
                else:
                    extra = tvmax_extra if mapping == "tvmax" else ()
                    best = train(mapping, data, settings, out, seed, extra)[0]
                trained[seed][mapping] = out / f"{mapping}{seed_suffix(seed, seeds)}.ckpt"
                shutil.copyfile(best, trained[seed][mapping])
        per_seed, captions = {}, {}
        for seed in seeds:
            per_seed[seed], by_mapping = evaluate_all(trained[seed], data.dataset, metrics, out,
                                                      seed_suffix(seed, seeds))
            captions.update({(seed, m): c for m, c in by_mapping.items()})
        summary["per_seed"] = per_seed
        write_results(out, summary)  # before SPICE and the figures: their failure loses nothing
        entries = load_test_split(data.dataset)
        if "SPICE" in metrics:
            print("\n== SPICE of every captioner (one run)")
            for (seed, mapping), (corpus, _) in score_spice(entries, captions).items():
                per_seed[seed][mapping]["SPICE"] = corpus
            write_results(out, summary)
        shown = {m: Captioner.load(path) for m, path in trained[seeds[0]].items()}
        write_figures(out, entries, shown, settings.n_figures)
        gallery = write_gallery(out, entries, shown, settings.n_gallery)
    for line in undefined_for_some_seeds(per_seed):
        print(f"notice: {line}")
    seeds_text = (f"mean ± sd over seeds {', '.join(map(str, seeds))}" if len(seeds) > 1
                  else f"seed {seeds[0]}")
    title = f"Synthetic test split ({settings.n_test} images), beam size 3, {seeds_text}"
    figure = plot_seed_metrics(per_seed, out / "metrics.png", title)
    return DemoOutcome(per_seed, title, figure, gallery)


def write_results(out: Path, summary: dict) -> None:
    """``results.json``: the settings, the encoder's accuracy, every seed's metrics per mapping
    and their mean and sd over the seeds."""
    from eval.table import mean_and_sd

    per_seed = summary["per_seed"]
    mappings = list(next(iter(per_seed.values())))
    keys = sorted({k for by_mapping in per_seed.values() for m in by_mapping.values() for k in m})
    spread = {
        m: {k: mean_and_sd([per_seed[s][m].get(k, math.nan) for s in per_seed]) for k in keys}
        for m in mappings
    }
    document = {
        **summary,
        "per_seed": {str(s): v for s, v in per_seed.items()},
        "mean": {m: {k: v[0] for k, v in spread[m].items()} for m in mappings},
        "sd": {m: {k: v[1] for k, v in spread[m].items()} for m in mappings},
    }
    write_json(out / "results.json", document, indent=2)
