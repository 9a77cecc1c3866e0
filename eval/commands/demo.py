"""``captioner demo``: the whole method end to end on the embedded synthetic dataset.

1. Generates the synthetic shapes dataset (Karpathy JSON, PNG images, COCO instances) unless it
   is already in ``OUT/synthetic-*``.
2. Pretrains the encoder on the training split (``captioner pretrain-encoder``): a ResNet-18 up
   to its stage ``layer3`` learns which object covers each cell of its grid (16 x 16; 8 x 8
   for the 128 px images of ``--quick``) (shape,
   colour, size), the offline stand-in for the paper's ImageNet encoder; its per-cell accuracy
   on the validation split is printed. Then every image is encoded once with it, frozen, and
   the float16 grid features are cached (``captioner prepare-features``). Both are made once
   per dataset and reused by later runs into the same ``--out`` (``--overwrite`` replaces the
   earlier results there); the same encoder serves all three mappings.
3. Trains softmax, sparsemax and TVmax output-attention captioners through the same
   LightningCLI and configs as ``captioner fit`` (``configs/demo_*.yaml``; best epoch on
   val/CIDEr), into ``OUT/runs/demo_<mapping>/version_N/`` with the exact config of each run,
   once per ``--seeds`` seed (the seed of the captioners' initialization and batch order; the
   data and the encoder stay those of ``--seed``). With ``--lam-grid``, TVmax's lambda is first
   chosen on the validation split (best val/CIDEr of the first seed), as the paper did.
   Each finished training is recorded in ``OUT/trainings.json``: a run stopped before its
   results (Ctrl-C) goes on when the same command is run again, and trains only the
   captioners it had not finished (``eval.demo_trainings``).
4. Decodes the test split from the images with each best checkpoint and scores it with the
   coco-caption metrics, REP, object recall, the attention statistics (zero attention, JS
   divergence of consecutive words, fused groups) and the attention precision (share of
   output attention on the named object's mask, at its shape word and over its whole phrase).
5. Writes ``results.json`` (every seed, and mean and sd over seeds), the table, the figure
   ``metrics.png``, per-word attention figures of a few test images and the side-by-side
   attention gallery ``gallery/index.html`` of the first seed's models.

SPICE needs jars that ``captioner fetch-spice`` installs (the README's quickstart runs it
first); when they are absent the demo scores without SPICE and says so. SPICE scores every
model's captions in one Java run, which loads its parser once.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

from captioner.cli import SIGINT_STATUS
from captioner.commands.options import close_progress_bars, command_parser, report_error
from data_prep.locks import held_alone
from data_prep.output_folders import clear_folder
from data_prep.paths import OutputPathError, check_output_dir
from data_prep.wording import counted, first_names
from eval.demo import (
    FINISHED_MARK,
    FULL,
    LOCK_NAME,
    QUICK,
    DemoSettings,
    earlier_results,
    prepare_data,
    run_demo,
)
from eval.demo_trainings import FILE_NAME as TRAININGS_FILE
from eval.demo_trainings import TrainingRecord

HELP = "train softmax / sparsemax / TVmax captioners on synthetic shapes and compare them"
MAX_SEED = 2**32 - 1


def main(argv: list[str]) -> int:
    parser = command_parser("captioner demo", __doc__)
    parser.add_argument("--out", type=Path, default=Path("demo_out"),
                        help="output folder (default: %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny smoke run (about 2 minutes the first time, while numba "
                        "compiles its kernels, under 1 after; the numbers mean nothing)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the synthetic data and the encoder (default 0)")
    parser.add_argument("--seeds", type=int, nargs="+", metavar="SEED",
                        help="train the captioners once per seed and report mean and sd "
                        "(default: --seed alone)")
    parser.add_argument("--lam-grid", type=float, nargs="+", metavar="LAM",
                        help="choose TVmax's lambda among these on the validation split "
                        "(default: the config's)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the results of an earlier demo run in --out, and "
                        "train every captioner again (its data, encoder and feature cache are "
                        "kept, and reused with the same settings; default: refused, and an "
                        "unfinished run goes on)")
    args = parser.parse_args(argv)
    seeds = args.seeds or [args.seed]
    # Lightning's seed_everything (numpy's generator) takes seeds of 32 bits.
    outside = sorted({seed for seed in (args.seed, *seeds) if not 0 <= seed <= MAX_SEED})
    if outside:
        parser.error(f"seeds must be in [0, {MAX_SEED}], got {first_names(outside)}")
    repeated = sorted({seed for seed in seeds if seeds.count(seed) > 1})
    if repeated:
        parser.error(f"--seeds gives {first_names(repeated)} more than once")
    bad_lams = [lam for lam in args.lam_grid or () if not (math.isfinite(lam) and lam > 0)]
    if bad_lams:
        parser.error(f"--lam-grid values must be finite and positive, got {first_names(bad_lams)}")
    lams = args.lam_grid or []
    repeated = sorted({lam for lam in lams if lams.count(lam) > 1})
    if repeated:
        parser.error(f"--lam-grid gives {first_names(repeated)} more than once")
    settings = replace(QUICK if args.quick else FULL, seed=args.seed)
    out = args.out.resolve()
    try:
        check_output_dir(out)
        out.mkdir(parents=True, exist_ok=True)
    except ValueError as exc:  # data_prep.paths.OutputPathError
        return report_error("captioner demo", exc)
    except OSError as exc:
        return report_error("captioner demo", exc, f"cannot create the folder {out}")
    busy = (f"{out}: another captioner demo is running in this folder now (it holds "
            f"{out / LOCK_NAME}); wait for it to end, or choose another --out")
    try:
        # One demo at a time in a folder: two would train into one run folder, rewrite one
        # record of trainings, and clear each other's results.
        with held_alone(out / LOCK_NAME, busy):
            return _demo_in(out, args, settings, seeds)
    except OutputPathError as exc:  # this one, or a feature cache another run is making
        return report_error("captioner demo", exc)


def _demo_in(out: Path, args: argparse.Namespace, settings: DemoSettings,
             seeds: list[int]) -> int:
    """The demo into the folder ``out``, which this process holds: earlier results checked,
    cleared or gone on from, the steps run and the table printed; the exit status."""
    try:
        earlier = earlier_results(out)
        if FINISHED_MARK in earlier and not args.overwrite:
            raise ValueError(
                f"{out}: holds the results of an earlier demo run "
                f"({first_names(earlier, 3)}); choose another --out, or pass "
                "--overwrite to replace them (data, encoder and feature cache made with the "
                "same settings are reused)")
        unfinished = earlier and not args.overwrite
        if unfinished:
            TrainingRecord(out)  # read before any work: a damaged record is one line
    except ValueError as exc:
        return report_error("captioner demo", exc)
    started = time.monotonic()
    try:
        # Before any earlier result is cleared: a file of the earlier run that cannot be
        # reused is named, and nothing is lost.
        data = prepare_data(out, settings)
        if unfinished:
            print(f"going on with the unfinished demo run in {out}: captioners it finished "
                  "training with the same settings are reused")
            clear_folder(out, [name for name in earlier if name != TRAININGS_FILE])
        elif earlier:
            print(f"replacing the earlier results in {out}: {', '.join(earlier)}")
            clear_folder(out, earlier)
        outcome = run_demo(out, data, settings, seeds, args.lam_grid)
    except KeyboardInterrupt:
        close_progress_bars()
        print(f"captioner demo: {_interrupted(out, args.overwrite)}", file=sys.stderr)
        return SIGINT_STATUS
    except ValueError as exc:
        return report_error("captioner demo", exc)

    from eval.table import format_seed_table

    print(f"\n{outcome.title}:\n")
    print(format_seed_table(outcome.per_seed))
    print(f"\nfigure: {outcome.figure}")
    if outcome.gallery is not None:
        print(f"gallery: {outcome.gallery}")
    minutes = (time.monotonic() - started) / 60
    print(f"results, checkpoints and figures: {out}  ({minutes:.1f} min)")
    return 0


def _interrupted(out: Path, overwrite: bool) -> str:
    """What an interrupted run into ``out`` kept, for its last line (``overwrite``: the run
    was given --overwrite, which the command that goes on must leave out)."""
    try:
        count = len(TrainingRecord(out).trainings)
    except ValueError:  # a record damaged meanwhile: its next reading names it
        count = 0
    if not count:
        return "interrupted before a captioner finished training"
    same = "the same command without --overwrite" if overwrite else "the same command"
    return (f"interrupted; {counted(count, 'captioner')} finished training "
            f"({out / TRAININGS_FILE}): {same} goes on from there, --overwrite starts over")
