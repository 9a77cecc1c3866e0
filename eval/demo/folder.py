"""The demo run into a folder, one at a time: earlier results checked, cleared or gone on
from, the steps of :mod:`eval.demo.steps` run and the table printed. What ``captioner demo`` runs;
torch is imported when the work starts, so that the command's options are read at once."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from captioner.cli import SIGINT_STATUS
from captioner.reporting import close_progress_bars, report_error
from data_prep.locks import held_alone
from data_prep.output_folders import clear_folder
from data_prep.paths import OutputPathError, check_output_dir
from data_prep.wording import counted, first_names
from eval.demo.steps import (
    FINISHED_MARK,
    FULL,
    LOCK_NAME,
    QUICK,
    DemoSettings,
    earlier_results,
    prepare_data,
    run_demo,
)
from eval.demo.trainings import FILE_NAME as TRAININGS_FILE
from eval.demo.trainings import TrainingRecord

MAX_SEED = 2**32 - 1


def check_demo_options(seed: int, seeds: Sequence[int] | None,
                       lam_grid: Sequence[float] | None) -> None:
    """ValueError naming the seeds or lambdas that cannot run: a seed outside 32 bits
    (Lightning's seed_everything takes no other), a seed or lambda given twice, a lambda that
    is not finite and positive."""
    seeds = list(seeds or [seed])
    outside = sorted({value for value in (seed, *seeds) if not 0 <= value <= MAX_SEED})
    if outside:
        raise ValueError(f"seeds must be in [0, {MAX_SEED}], got {first_names(outside)}")
    repeated = sorted({value for value in seeds if seeds.count(value) > 1})
    if repeated:
        raise ValueError(f"--seeds gives {first_names(repeated)} more than once")
    lams = list(lam_grid or [])
    bad_lams = [lam for lam in lams if not (math.isfinite(lam) and lam > 0)]
    if bad_lams:
        raise ValueError(f"--lam-grid values must be finite and positive, got "
                         f"{first_names(bad_lams)}")
    repeated = sorted({lam for lam in lams if lams.count(lam) > 1})
    if repeated:
        raise ValueError(f"--lam-grid gives {first_names(repeated)} more than once")


def demo(
    out: Path = Path("demo_out"),
    quick: bool = False,
    seed: int = 0,
    seeds: list[int] | None = None,
    lam_grid: list[float] | None = None,
    overwrite: bool = False,
) -> int:
    """Train softmax, sparsemax and TVmax captioners on synthetic shapes in ``out`` and compare
    them; the exit status: 0, 2 for a user error (one line, before any work), 130 on Ctrl-C
    (the same call goes on).

    Args:
        out: output folder.
        quick: tiny smoke run (about 2 minutes the first time, while numba compiles its
            kernels, under 1 after; the numbers mean nothing).
        seed: seed of the synthetic data and the encoder.
        seeds: train the captioners once per seed and report mean and sd (default: --seed
            alone).
        lam_grid: choose TVmax's lambda among these on the validation split (default: the
            config's).
        overwrite: replace the results of an earlier demo run in --out, and train every
            captioner again (its data, encoder and feature cache are kept, and reused with
            the same settings; default: refused, and an unfinished run goes on).
    """
    prog = "captioner demo"
    settings = replace(QUICK if quick else FULL, seed=seed)
    out = Path(out).resolve()
    try:
        check_demo_options(seed, seeds, lam_grid)
        check_output_dir(out)
        out.mkdir(parents=True, exist_ok=True)
    except ValueError as exc:  # data_prep.paths.OutputPathError among them
        return report_error(prog, exc)
    except OSError as exc:
        return report_error(prog, exc, f"cannot create the folder {out}")
    busy = (f"{out}: another captioner demo is running in this folder now (it holds "
            f"{out / LOCK_NAME}); wait for it to end, or choose another --out")
    try:
        # One demo at a time in a folder: two would train into one run folder, rewrite one
        # record of trainings, and clear each other's results.
        with held_alone(out / LOCK_NAME, busy):
            return _demo_in(out, overwrite, settings, list(seeds or [seed]), lam_grid)
    except OutputPathError as exc:  # this one, or a feature cache another run is making
        return report_error(prog, exc)


def _demo_in(out: Path, overwrite: bool, settings: DemoSettings, seeds: list[int],
             lam_grid: list[float] | None) -> int:
    """The demo into the folder ``out``, which this process holds: earlier results checked,
    cleared or gone on from, the steps run and the table printed; the exit status."""
    try:
        earlier = earlier_results(out)
        if FINISHED_MARK in earlier and not overwrite:
            raise ValueError(
                f"{out}: holds the results of an earlier demo run "
                f"({first_names(earlier, 3)}); choose another --out, or pass "
                "--overwrite to replace them (data, encoder and feature cache made with the "
                "same settings are reused)")
        unfinished = earlier and not overwrite
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
        outcome = run_demo(out, data, settings, seeds, lam_grid)
    except KeyboardInterrupt:
        close_progress_bars()
        print(f"captioner demo: {_interrupted(out, overwrite)}", file=sys.stderr)
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
