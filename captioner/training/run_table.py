"""The table that ``captioner runs`` prints: one line per version of each training run under
a runs folder, with the attention it trained with, its progress, its best score and
checkpoints (as its ``checkpoints/progress.json`` records them) and its last test scores."""

from __future__ import annotations

import sys
from pathlib import Path

from captioner.training.folders import (
    RunInfo,
    evaluation_only,
    list_runs,
    recorded_checkpoint,
    run_attention,
    tested_scores,
    training_now,
    version_folders,
    version_number,
)
from data_prep.text import printable

PROG = "captioner runs"


def print_runs(root: Path = Path("runs")) -> int:
    """Print the table of the training runs under ``root``, one line per run version, or ``no
    runs under ROOT``; the exit status: 0, or 2 when ``root`` is not a folder, or is a run's
    own folder (one line on stderr naming the folder of runs to give instead).

    Args:
        root: runs folder.
    """
    if not root.is_dir():
        print(f"{PROG}: {'not a folder' if root.exists() else 'no such folder'}: {root}",
              file=sys.stderr)
        return 2
    runs = list_runs(root)
    above = None if runs else _runs_folder_above(root)
    if above is not None:
        print(f"{PROG}: {root} is a run's folder, not a folder of runs; give the one that "
              f"holds them: --root {above}", file=sys.stderr)
        return 2
    if not runs:
        print(f"no runs under {root}")
        return 0
    for line in table_lines(runs):
        # Names and paths read from the runs' files: escaped, so that none can clear the
        # terminal or forge a line.
        print(printable(line))
    return 0


def _runs_folder_above(folder: Path) -> Path | None:
    """The runs folder above ``folder`` when it is a run's folder (runs/NAME) or one of its
    versions (runs/NAME/version_N), which lists nothing as a root; else None."""
    folder = folder.resolve()
    if version_number(folder) is not None and len(folder.parents) > 1:
        return folder.parents[1]
    return folder.parent if version_folders(folder.parent, folder.name) else None


def table_lines(runs: list[RunInfo]) -> list[str]:
    """The table of ``runs``: a header and one line per run version."""
    # A run that monitored another metric than val/CIDEr has its best score of that metric.
    bests = [_best(run.progress) for run in runs]
    width = max(len("best"), *map(len, bests))
    attentions = [run_attention(run.folder) for run in runs]
    wide = max(len("in/out attention"), *map(len, attentions))
    epochs = [_epochs(run.progress) for run in runs]
    many = max(len("epochs"), *map(len, epochs))
    lines = [f"{'run':<24} {'version':<10} {'in/out attention':<{wide}} {'epochs':>{many}} "
             f"{'step':>8} {'best':<{width}}  checkpoints"]
    for run, attention, best, done in zip(runs, attentions, bests, epochs, strict=True):
        start = f"{run.name:<24} {run.folder.name:<10} {attention:<{wide}} "
        progress = run.progress
        if progress is None:
            lines.append(f"{start}{done:>{many}} {'-':>8} {best:<{width}}  "
                         f"{_untrained(run.folder)}")
            continue
        best_file, last_file = (_where(run.folder, progress.get(key))
                                for key in ("best_checkpoint", "last_checkpoint"))
        tested = tested_scores(run.folder)
        lines.append(f"{start}{done:>{many}} {progress['global_step']:>8} "
                     f"{best:<{width}}  best {best_file}  last {last_file}"
                     + (f"  {tested}" if tested else ""))
    return lines


def _epochs(progress: dict | None) -> str:
    """The epochs a run has done, of the max_epochs it trains to where its progress.json
    says (``2/6``: stopped, or still training; ``6/6``: done); ``-`` before any."""
    if progress is None:
        return "-"
    done, limit = progress["epochs_done"], progress.get("max_epochs")
    return f"{done}/{limit}" if limit else str(done)


def _untrained(folder: Path) -> str:
    """What a run version without progress.json holds, in parentheses: progress.json comes
    with the first checkpoint, so the checkpoints there, the scores of an evaluation only, a
    stop before the first checkpoint, or none yet."""
    found = sorted(path.name for path in (folder / "checkpoints").glob("*.ckpt"))
    if found:
        return f"(progress.json missing or unreadable; checkpoints: {', '.join(found)})"
    scored = evaluation_only(folder)
    if scored:
        return f"(no training: {scored[0]} of {scored[1]}, scores in {folder / 'metrics.csv'})"
    if training_now(folder) is False:
        return "(stopped before its first checkpoint: nothing to resume)"
    return "(no checkpoint yet)"


def _where(run: Path, recorded: str | None) -> str:
    """A checkpoint that the run's progress.json records, where it is now (its own
    checkpoints/ folder for a moved or copied run); ``-`` for none, ``(missing)`` after a
    file that is not there."""
    path = recorded_checkpoint(run / "checkpoints", recorded)
    if path is None:
        return "-"
    return str(path) if path.is_file() else f"{path} (missing)"


def _best(progress: dict | None) -> str:
    """The best score of a run's progress.json and its metric (``val/`` left out): ``CIDEr
    0.8123``; ``-`` before any."""
    score = (progress or {}).get("best_score")
    if score is None:
        return "-"
    metric = str(progress.get("monitor") or "val/CIDEr").removeprefix("val/")
    return f"{metric} {score:.4f}"
