"""``captioner bench fit``: a real ``captioner fit`` on COCO-shaped data, against the model alone.

It writes COCO-shaped data once (``--images`` training images with 5 random captions of 15 words
each over a ``--vocab-size`` word vocabulary, and random float16 ``grid x grid x 2048`` features
in an HDF5 feature cache, as ``captioner prepare-features`` writes them), then trains each
mapping's paper config (``configs/coco_<mapping>.yaml``) through the same CLI as ``captioner
fit`` for ``--steps`` steps, validation off, and times the steps after ``--warmup-steps``. It
also times the input pipeline alone (the training DataLoader, no model) and, in the same run,
the model's own training step on one resident batch of the same shape (the fit's step, gradient
clipping and deferred checks included, without data loading and without Lightning), so that
fit/model says how much of a real step the input pipeline and the trainer add: at 1.00x they
are hidden entirely. Where they add it shows in the phases of a step, timed by the host's clock
with no sync added: the fit's between Lightning's hooks (forward and loss, backward, optimizer,
between steps), the model's own around the same calls (and the checks read back).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from captioner import CONFIGS
from captioner.benchmarks import (
    PhaseClock,
    markdown_table,
    refuse_bad_seed,
    refuse_below,
    refuse_unknown,
    refuse_unwritable,
    torch_device,
    write_markdown,
)
from data_prep.machine import usable_cpus
from data_prep.paths import check_output_dir, check_output_file
from data_prep.wording import names

HELP = "time a real fit on generated COCO-shaped data against the model's own training step"

COCO_TRAIN_PAIRS = 566_747  # Karpathy train + restval: 113,287 images, their captions
PAPER_EPOCHS = 50
CAPTIONS_PER_IMAGE = 5
WORDS_PER_CAPTION = 15
CHANNELS = 2048  # the paper configs' encoder: ResNet-101 up to layer4
ACCELERATORS = ("auto", "cpu", "gpu", "cuda")  # Lightning's names of the CPU and of CUDA


PRELOADS = ("false", "true", "device")
# The least value of each counted option.
LEAST = {"images": 1, "grid": 1, "vocab_size": 1, "batch_size": 1, "steps": 1,
         "warmup_steps": 0, "num_workers": 0}


def check_options(**options) -> None:
    """ValueError naming the first option of :func:`benchmark` that cannot run, before any
    data are written."""
    from captioner.training.cli import MATMUL_PRECISIONS

    for name, low in LEAST.items():
        refuse_below(name.replace("_", "-"), options[name], low)
    try:
        names("mapping", _check_config)(options["mappings"])
    except ValueError as exc:
        raise ValueError(f"argument --mappings: {exc}") from None
    refuse_unknown("preload-features", options["preload_features"], PRELOADS)
    if options["precision"] is not None:
        refuse_unknown("precision", options["precision"], _precisions())
    refuse_unknown("float32-matmul-precision", options["float32_matmul_precision"],
                   MATMUL_PRECISIONS)
    _check_accelerator(options["accelerator"])
    refuse_bad_seed(options["seed"])
    steps, warmup, images, batch = (options[name] for name in ("steps", "warmup_steps",
                                                               "images", "batch_size"))
    if warmup >= steps:
        raise ValueError(f"--warmup-steps {warmup} leaves no step of --steps {steps} to time")
    if images < min_images(batch):
        raise ValueError(f"--images {images} give {images * CAPTIONS_PER_IMAGE} training "
                         f"captions, one batch of --batch-size {batch}; timing the loader "
                         f"needs two: give --images {min_images(batch)} or more")
    refuse_unwritable("--data", options["data"], check_output_dir)
    refuse_unwritable("--markdown", options["markdown"], check_output_file)


def _check_config(mapping: str) -> None:
    """Refuse a mapping without a paper config (ValueError), before any data are written."""
    config = CONFIGS / f"coco_{mapping}.yaml"
    if not config.is_file():
        raise ValueError(f"no config {config} for mapping {mapping!r}")


def _precisions() -> tuple[str, ...]:
    """The precisions that Lightning's Trainer takes, as its signature lists them (the list
    the fit's own config parser checks ``--trainer.precision`` against), as strings."""
    import typing

    from lightning import Trainer

    def literals(hint) -> list:
        parts = typing.get_args(hint)
        return [value for part in parts for value in literals(part)] if parts else [hint]

    hint = typing.get_type_hints(Trainer.__init__)["precision"]
    return tuple(dict.fromkeys(str(v) for v in literals(hint) if not isinstance(v, type)))


def _check_accelerator(name: str) -> None:
    """ValueError for a Lightning accelerator that captioner does not run on (the CPU or CUDA,
    as :func:`captioner.inference.pipeline.resolve_device` says) or that this machine lacks."""
    if name not in ACCELERATORS:
        raise ValueError(f"argument --accelerator: {name!r}: captioner runs on the CPU or on "
                         f"CUDA ({', '.join(ACCELERATORS)})")
    if name in ("gpu", "cuda"):
        try:
            torch_device("cuda")
        except ValueError as exc:
            reason = str(exc).removeprefix("argument --device: ")
            raise ValueError(f"argument --accelerator: {name!r}: {reason}") from None


def min_images(batch_size: int) -> int:
    """The fewest ``--images`` whose training captions fill more than one batch of
    ``batch_size``: :func:`write_coco_shaped` gives every training image
    ``CAPTIONS_PER_IMAGE`` captions, the fit's loader keeps the last, partial batch, and
    :func:`time_loader` times the batches after the first of an epoch."""
    return batch_size // CAPTIONS_PER_IMAGE + 1


def write_coco_shaped(folder: Path, *, images: int, grid: int, channels: int,
                      vocab_size: int, seed: int) -> tuple[Path, Path]:
    """Karpathy JSON and feature cache of random COCO-shaped data in ``folder`` (reused when
    present with the same settings); returns (karpathy json, feature cache)."""
    import numpy as np
    from tqdm.auto import tqdm

    from data_prep.atomic import atomic_write
    from data_prep.features import FeatureCacheWriter

    settings = {"images": images, "grid": grid, "channels": channels,
                "vocab_size": vocab_size, "seed": seed}
    karpathy, cache, stamp = (folder / "dataset_coco_shaped.json",
                              folder / "features.h5", folder / "settings.json")
    if stamp.is_file() and json.loads(stamp.read_text()) == settings and cache.is_file():
        return karpathy, cache
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    words = rng.integers(0, vocab_size, size=(images + 1, CAPTIONS_PER_IMAGE, WORDS_PER_CAPTION))
    entries = [
        {"imgid": i, "cocoid": i, "filepath": "none", "filename": f"{i}.jpg",
         "split": "train" if i < images else "val",
         "sentences": [_sentence([f"w{w}" for w in caption]) for caption in words[i]]}
        for i in range(images + 1)
    ]
    with atomic_write(karpathy) as file:
        file.write(json.dumps({"dataset": "coco", "images": entries}))
    encoder = {"arch": "resnet101", "weights": None, "image_size": 256, "layer": "layer4"}
    chunk = 256
    with FeatureCacheWriter(cache, grid=(grid, grid), channels=channels,
                            encoder=encoder) as writer:
        for start in tqdm(range(0, images + 1, chunk), desc="writing features", unit="chunk"):
            ids = list(range(start, min(start + chunk, images + 1)))
            shape = (len(ids), grid, grid, channels)
            writer.add(ids, rng.standard_normal(shape, dtype=np.float32).astype(np.float16))
    stamp.write_text(json.dumps(settings))
    return karpathy, cache


def _sentence(tokens: list[str]) -> dict:
    return {"tokens": tokens, "raw": " ".join(tokens)}


def _fit_arguments(mapping: str, args: SimpleNamespace, karpathy: Path, cache: Path,
                   runs: Path) -> list[str]:
    arguments = [
        "--config", str(CONFIGS / f"coco_{mapping}.yaml"), "--run_name", f"bench_{mapping}",
        "--data.karpathy_json", str(karpathy), "--data.image_root", str(karpathy.parent),
        "--data.feature_cache", str(cache), "--data.min_count", "1",
        "--data.batch_size", str(args.batch_size),
        "--data.preload_features", args.preload_features,
        "--model.encoder_weights", "null",
        "--trainer.accelerator", args.accelerator, "--trainer.devices", "1",
        "--trainer.max_steps", str(args.steps), "--trainer.limit_val_batches", "0",
        "--trainer.num_sanity_val_steps", "0", "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false",
        "--trainer.logger.init_args.save_dir", str(runs),
        "--checkpoint.dirpath", str(runs / "checkpoints" / mapping), "--checkpoint.monitor",
        "null", "--checkpoint.save_top_k", "0",
        "--float32_matmul_precision", args.float32_matmul_precision,
    ]
    if args.num_workers is not None:
        arguments += ["--data.num_workers", str(args.num_workers)]
    if args.precision is not None:
        arguments += ["--trainer.precision", args.precision]
    return arguments


# Where the host spends a fit's step, between Lightning's hooks: the training step (forward
# and loss), backward, the rest of the step (clipping, the optimizer), and from its end to the
# next step's start (the module reading its checks back, Lightning's loop, the next batch).
FIT_PHASES = ("forward+loss", "backward", "optimizer", "between steps")


def _step_timer(warmup_steps: int):
    """A callback timing the training steps after ``warmup_steps`` up to the end of the last
    one (one sync at each end): what the fit does once it has stepped, such as writing its
    checkpoint at the end of the epoch, is left out. Between those ends it also sums the host
    time of each of :data:`FIT_PHASES` (``phases``), by the clock at Lightning's hooks with
    no sync added."""
    import lightning as L
    import torch

    class StepTimer(L.Callback):
        def __init__(self) -> None:
            self.start = self.seconds = None
            self.steps = 0
            self.phases = PhaseClock(FIT_PHASES)

        def _now(self, module) -> float:
            if module.device.type == "cuda":
                torch.cuda.synchronize(module.device)
            return time.perf_counter()

        def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
            if trainer.global_step == warmup_steps and self.start is None:
                self.start, self.first_step = self._now(module), trainer.global_step
                self.phases.start()
            else:
                self.phases.ends("between steps")

        def on_before_backward(self, trainer, module, loss) -> None:
            self.phases.ends("forward+loss")

        def on_after_backward(self, trainer, module) -> None:
            self.phases.ends("backward")

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
            self.phases.ends("optimizer")
            if self.start is not None and trainer.global_step == trainer.max_steps:
                self.phases.stop()
                self.seconds = self._now(module) - self.start
                self.steps = trainer.global_step - self.first_step

    return StepTimer()


def time_loader(datamodule, batches: int) -> tuple[float, float]:
    """Milliseconds per training batch of the input pipeline alone (no model), after one
    batch to start the workers; at most ``batches``, and no more than one epoch holds. Two
    times: elapsed, and the CPU time of the calling thread, the training loop's own share of
    the pipeline (with workers, receiving their batches), which a step bound by launching
    kernels pays in full.

    Raises:
        ValueError: an epoch of one batch (:func:`min_images` says how many images avoid it).
    """
    datamodule.setup("fit")
    loader = datamodule.train_dataloader()
    if len(loader) < 2:
        raise ValueError(f"one epoch holds {len(loader)} training batch; timing the loader "
                         "needs two")
    batches = min(batches, len(loader) - 1)
    loader = iter(loader)
    next(loader)
    start, thread_start = time.perf_counter(), time.thread_time()
    for _ in range(batches):
        next(loader)
    elapsed, thread = time.perf_counter() - start, time.thread_time() - thread_start
    return 1000.0 * elapsed / batches, 1000.0 * thread / batches


def time_fit(mapping: str, args: SimpleNamespace, karpathy: Path, cache: Path,
             runs: Path) -> dict:
    """Seconds per step of a real fit, and the model and vocabulary it trained."""
    from captioner.benchmarks import counting_device_solver
    from captioner.training.cli import build_cli

    cli = build_cli(_fit_arguments(mapping, args, karpathy, cache, runs), run=False)
    workers = _loader_workers(cli.datamodule, args.num_workers)
    loader_ms, loop_ms = time_loader(cli.datamodule, min(args.steps, 200))
    timer = _step_timer(args.warmup_steps)
    cli.trainer.callbacks.append(timer)
    _, grids, fallback = counting_device_solver(
        lambda: cli.trainer.fit(cli.model, datamodule=cli.datamodule))
    return {"fit_ms": 1000.0 * timer.seconds / timer.steps, "steps": timer.steps,
            "fit_phases_ms": timer.phases.milliseconds_per_step(timer.steps),
            "loader_ms": loader_ms, "loop_ms": loop_ms,
            # Lightning moves the module back to the CPU when fit ends.
            "module": cli.model, "device": cli.trainer.strategy.root_device,
            "grids": grids, "fallback": fallback, "workers": workers,
            "precision": cli.trainer.precision}


def _loader_workers(datamodule, given: int | None) -> str:
    """The fit's DataLoader workers, as the report says them: ``given`` (--num-workers,
    already in the config), or else the DataModule's default where the config leaves them
    null (4 at most the usable CPUs, none with device-held features), or else the config's
    ``num_workers``, lowered to the usable CPUs where it asks for more (they would only contend
    for the CPUs, and torch warns about them at length at every epoch's start)."""
    if given is not None:
        return str(given)
    workers, usable = datamodule.loader_workers, usable_cpus()
    if datamodule.hparams.num_workers is None:
        return f"{workers} (the default)"
    if workers <= usable:
        return f"{workers} (the config's)"
    datamodule.hparams.num_workers = usable  # read when the loaders are made, after this
    return f"{usable} (the config's {workers}, capped at the usable CPUs)"


def time_model_step(module, args: SimpleNamespace, steps: int) -> tuple[float, dict]:
    """Milliseconds of the model's own training step on one resident batch of the fit's shape
    and precision: the step of ``captioner fit`` (forward from float16 features, loss,
    backward, the module's gradient clipping, Adam, one host sync for the deferred checks)
    without the input pipeline and without Lightning, averaged over ``steps`` steps: as many
    as the fit's timer took, so that fit/model compares averages of equal length. Also the
    host milliseconds of each of ``STEP_PHASES`` (no sync added), per step."""
    import torch

    from captioner.benchmarks.model import STEP_PHASES, train_step
    from captioner.training.optimizer import adam

    device, hp = module.device, module.hparams
    optimizer = adam(module.parameters(), lr=hp.lr, betas=hp.betas)
    generator = torch.Generator().manual_seed(args.seed)
    shape = (args.batch_size, args.grid, args.grid, CHANNELS)
    features = torch.randn(shape, generator=generator).half().to(device)
    captions = torch.randint(4, hp.vocab_size, (args.batch_size, WORDS_PER_CAPTION + 2),
                             generator=generator).to(device)
    bf16 = args.precision is not None and args.precision.startswith("bf16")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def step(phases: PhaseClock) -> None:
        autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else None
        phases.start()
        train_step(module.model, optimizer, features, captions, output_mapping=hp.output_mapping,
                   clip_norm=hp.gradient_clip_norm, autocast=autocast, mark=phases.ends)

    module.train()
    for _ in range(3):
        step(PhaseClock(STEP_PHASES))
    sync()
    phases = PhaseClock(STEP_PHASES)
    start = time.perf_counter()
    for _ in range(steps):
        step(phases)
    sync()
    return 1000.0 * (time.perf_counter() - start) / steps, phases.milliseconds_per_step(steps)


def benchmark(mappings: str = "softmax,tvmax", images: int = 8000, grid: int = 8,
              vocab_size: int = 10000, batch_size: int = 64, steps: int = 500,
              warmup_steps: int = 50, num_workers: int | None = None,
              preload_features: str = "false", precision: str | None = None,
              float32_matmul_precision: str = "highest", accelerator: str = "auto",
              data: Path | None = None, seed: int = 0, markdown: Path | None = None) -> int:
    """Time a real fit of each mapping's paper config on generated COCO-shaped data, its input
    pipeline alone and the model's own training step, and print the table; the exit status, 0.

    Args:
        mappings: output attention mappings, comma-separated, each trained with
            configs/coco_<name>.yaml.
        images: training images.
        grid: feature grid side, as on COCO.
        vocab_size: words in the captions.
        batch_size: captions per training batch.
        steps: training steps per fit.
        warmup_steps: untimed steps first, fewer than steps.
        num_workers: DataLoader workers (null: the config's, or where it leaves them null 4,
            none with preload_features device; either at most the usable CPUs).
        preload_features: data.preload_features: false, true (hold the features in host
            memory) or device (on the training device).
        precision: --trainer.precision of the fit, one that Lightning's Trainer takes
            (null: the config's).
        float32_matmul_precision: torch.set_float32_matmul_precision: highest, high or medium.
        accelerator: --trainer.accelerator of the fit: auto, cpu, gpu or cuda.
        data: folder for the generated data, kept and reused (null: a temporary folder,
            deleted at the end).
        seed: seed of the generated data and of the model step's batch.
        markdown: also write the table as markdown to this file, under a line naming the
            machine, the library versions and the date (checked before anything is timed).
    """
    args = SimpleNamespace(**locals())  # the options by name, as the steps below read them
    with tempfile.TemporaryDirectory(prefix="captioner-bench-fit-") as scratch:
        karpathy, cache = write_coco_shaped(
            data or Path(scratch) / "data", images=images, grid=grid, channels=CHANNELS,
            vocab_size=vocab_size, seed=seed)
        rows = {mapping: _time_mapping(mapping, args, karpathy, cache, Path(scratch) / "runs")
                for mapping in names("mapping")(mappings)}
    print(_report(rows, args))
    first = next(iter(rows.values()))
    write_markdown(markdown, torch_device(first["device"]),
                   f"Settings: {_settings(rows, args)}.",
                   markdown_table(COLUMNS, _cells(rows, args)), _notes(rows, args))
    return 0


def _time_mapping(mapping: str, args: SimpleNamespace, karpathy: Path, cache: Path,
                  runs: Path) -> dict:
    """The row of ``mapping``: its fit's step and phases, and the model's own on the fit's
    module."""
    fit = time_fit(mapping, args, karpathy, cache, runs)
    model_ms, model_phases_ms = time_model_step(fit["module"].to(fit["device"]), args,
                                                fit["steps"])
    return {"fit_ms": fit["fit_ms"], "model_ms": model_ms,
            "fit_phases_ms": fit["fit_phases_ms"], "model_phases_ms": model_phases_ms,
            "loader_ms": fit["loader_ms"], "loop_ms": fit["loop_ms"],
            "device": str(fit["device"]), "steps": fit["steps"],
            "grids": fit["grids"], "fallback": fit["fallback"],
            "workers": fit["workers"], "precision": fit["precision"]}


COLUMNS = ("mapping", "loader it/s", "loop ms", "fit it/s", "fit ms", "model ms", "fit/model",
           "COCO epoch min", f"{PAPER_EPOCHS} epochs h")
# The text report's column widths (the mapping's left-aligned, the figures right-aligned).
WIDTHS = (10, 12, 9, 10, 9, 10, 11, 16, 13)


def _settings(rows: dict[str, dict], args: SimpleNamespace) -> str:
    first = next(iter(rows.values()))  # the mappings share the paper configs' settings
    precision = args.precision or f"{first['precision']} (the config's)"
    return (f"{args.images} images x {CAPTIONS_PER_IMAGE} captions, features {args.grid}x"
            f"{args.grid}x{CHANNELS} float16, batch {args.batch_size}, device {first['device']}, "
            f"precision {precision}, loader workers {first['workers']}, float32 matmul "
            f"{args.float32_matmul_precision}, preload {args.preload_features}; "
            f"steps {args.warmup_steps + 1}-{args.steps} timed")


def _cells(rows: dict[str, dict], args: SimpleNamespace) -> list[list[str]]:
    """One row of strings per mapping (see :data:`COLUMNS`)."""
    steps_per_epoch = -(-COCO_TRAIN_PAIRS // args.batch_size)
    cells = []
    for mapping, row in rows.items():
        epoch_min = row["fit_ms"] * steps_per_epoch / 60_000
        cells.append([mapping, f"{1000 / row['loader_ms']:.1f}", f"{row['loop_ms']:.3f}",
                      f"{1000 / row['fit_ms']:.1f}", f"{row['fit_ms']:.1f}",
                      f"{row['model_ms']:.1f}", f"{row['fit_ms'] / row['model_ms']:.2f}x",
                      f"{epoch_min:.1f}", f"{epoch_min * PAPER_EPOCHS / 60:.1f}"])
    return cells


def _notes(rows: dict[str, dict], args: SimpleNamespace) -> list[str]:
    steps_per_epoch = -(-COCO_TRAIN_PAIRS // args.batch_size)
    notes = ["loop ms: the training thread's CPU time per loader batch (with workers, to "
             "receive it)",
             f"COCO epoch: {COCO_TRAIN_PAIRS:,} caption pairs = {steps_per_epoch:,} steps, "
             "training only (no validation)"]
    notes += [f"{mapping} phases, ms a step: fit {_phases(row['fit_phases_ms'])}; model "
              f"{_phases(row['model_phases_ms'])}" for mapping, row in rows.items()]
    notes.append("phases: the host's time between Lightning's hooks (fit) and in the model's "
                 "own step, no sync added: a step bound by launching kernels spends its time "
                 "where they are launched, one bound by the GPU where the host waits for it "
                 "(the checks; in the fit they are read between steps)")
    notes += [f"{mapping}: TVmax device solver left {row['fallback']} of {row['grids']} grids "
              "to the CPU solver" for mapping, row in rows.items() if row["grids"]]
    return notes


def _report(rows: dict[str, dict], args: SimpleNamespace) -> str:
    def line(cells) -> str:
        return "".join(f"{cell:<{width}}" if i == 0 else f"{cell:>{width}}"
                       for i, (cell, width) in enumerate(zip(cells, WIDTHS, strict=True)))

    return "\n".join([_settings(rows, args), line(COLUMNS),
                      *map(line, _cells(rows, args)), *_notes(rows, args)])


def _phases(milliseconds: dict[str, float]) -> str:
    return ", ".join(f"{phase} {ms:.2f}" for phase, ms in milliseconds.items())
