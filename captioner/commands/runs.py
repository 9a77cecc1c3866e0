"""``captioner runs``: the training runs under a runs folder, with their progress.

One line per ``ROOT/NAME/version_N`` (and per version a fit named, ``ROOT/NAME/V``): the
input/output attention it trained with (and the output's keywords, from its config.yaml), epochs
done, global step, the best score with the metric it is of (``CIDEr``, the validation CIDEr,
unless the run monitored another: ``Bleu_4``, ``train/loss``) and the best and last
checkpoints, as recorded in ``checkpoints/progress.json`` at the run's last
save, and the scores of its last ``captioner test`` (``test: CIDEr ... Bleu_4 ...``) where it
was tested. A version that holds only the scores of
``test`` or ``validate`` of a checkpoint from outside the runs names that checkpoint instead.
"""

from __future__ import annotations

import sys
from pathlib import Path

from captioner.commands.options import command_parser

HELP = ("list training runs (runs/NAME/version_N) with their attention mappings, best "
        "validation CIDEr (or the metric they monitor) and checkpoints")


def main(argv: list[str]) -> int:
    parser = command_parser("captioner runs", __doc__)
    parser.add_argument("--root", type=Path, default=Path("runs"),
                        help="runs folder (default: %(default)s)")
    args = parser.parse_args(argv)

    from captioner.training.folders import (
        evaluation_only,
        list_runs,
        run_attention,
        tested_scores,
        training_now,
        version_folders,
        version_number,
    )

    if not args.root.is_dir():
        problem = "not a folder" if args.root.exists() else "no such folder"
        print(f"captioner runs: {problem}: {args.root}", file=sys.stderr)
        return 2
    runs = list_runs(args.root)
    root = args.root.resolve()
    # A run's folder (runs/NAME) or one of its versions (runs/NAME/version_N) lists nothing
    # as a root: name the runs folder above it.
    above = (root.parents[1] if version_number(root) is not None and len(root.parents) > 1
             else root.parent if version_folders(root.parent, root.name) else None)
    if not runs and above is not None:
        print(f"captioner runs: {args.root} is a run's folder, not a folder of runs; give "
              f"the one that holds them: --root {above}", file=sys.stderr)
        return 2
    if not runs:
        print(f"no runs under {args.root}")
        return 0
    # A run that monitored another metric than val/CIDEr has its best score of that metric.
    bests = [_best(run.progress) for run in runs]
    width = max(len("best"), *map(len, bests))
    attentions = [run_attention(run.folder) for run in runs]
    wide = max(len("in/out attention"), *map(len, attentions))
    print(f"{'run':<24} {'version':<10} {'in/out attention':<{wide}} {'epochs':>6} {'step':>8} "
          f"{'best':<{width}}  checkpoints")
    for run, attention, best in zip(runs, attentions, bests, strict=True):
        progress = run.progress
        if progress is None:
            # progress.json comes with the first checkpoint: without it, say what is there.
            found = sorted(path.name for path in (run.folder / "checkpoints").glob("*.ckpt"))
            scored = None if found else evaluation_only(run.folder)
            if found:
                note = f"(progress.json missing or unreadable; checkpoints: {', '.join(found)})"
            elif scored:
                note = (f"(no training: {scored[0]} of {scored[1]}, scores in "
                        f"{run.folder / 'metrics.csv'})")
            elif training_now(run.folder) is False:
                note = "(stopped before its first checkpoint: nothing to resume)"
            else:
                note = "(no checkpoint yet)"
            print(f"{run.name:<24} {run.folder.name:<10} {attention:<{wide}} {'-':>6} {'-':>8} "
                  f"{best:<{width}}  {note}")
            continue
        best_file, last_file = (_where(run.folder, progress.get(key))
                                for key in ("best_checkpoint", "last_checkpoint"))
        tested = tested_scores(run.folder)
        print(f"{run.name:<24} {run.folder.name:<10} {attention:<{wide}} "
              f"{progress['epochs_done']:>6} {progress['global_step']:>8} {best:<{width}}  "
              f"best {best_file}  last {last_file}" + (f"  test: {tested}" if tested else ""))
    return 0


def _where(run: Path, recorded: str | None) -> str:
    """A checkpoint that the run's progress.json records, where it is now (its own
    checkpoints/ folder for a moved or copied run); ``-`` for none, ``(missing)`` after a
    file that is not there."""
    from captioner.training.folders import recorded_checkpoint

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
