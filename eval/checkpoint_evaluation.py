"""Evaluate a checkpoint on a Karpathy split into an output folder: ``results_SPLIT.json`` and
``metrics_SPLIT.json``, an earlier evaluation replaced only by a whole new one, the captions
kept when their metrics fail. What ``captioner evaluate`` runs; torch is imported when the
work starts, so that the command's options are read at once (hence no type-only imports here:
jsonargparse runs them to read the signature)."""

from __future__ import annotations

import math
import shlex
import sys
from pathlib import Path
from typing import Literal

from captioner.model.decoding_options import DecodingOverrides
from data_prep.settings_files import check_options_at_least
from eval.evaluation import evaluate_captioner
from eval.metrics.scoring import ALL_METRICS

PROG = "captioner evaluate"


def evaluate_checkpoint(
    ckpt: Path,
    data: Path,
    images: Path,
    split: str = "test",
    instances: Path | None = None,
    features: Literal["run", "images"] = "run",
    decoding: DecodingOverrides | None = None,
    batch_size: int = 16,
    device: str | None = None,
    progress: bool = True,
    metrics: str = ",".join(ALL_METRICS),
    spice_timeout: float | None = None,
    out: Path = Path("evaluation"),
    overwrite: bool = False,
) -> int:
    """Caption a Karpathy split with a checkpoint, score it and write ``results_SPLIT.json``
    and ``metrics_SPLIT.json`` into ``out``; the exit status: 0, 2 for a user error (one line,
    before any image is captioned), 1 when the metrics failed (the captions kept, with the
    score command that scores them), 130 on Ctrl-C.

    Args:
        ckpt: trained checkpoint (.ckpt), as 'captioner fit' writes it.
        data: Karpathy split JSON.
        images: image root of the Karpathy file.
        split: split to evaluate.
        instances: COCO instances JSON for object mentions.
        features: run: read the features of the feature cache the checkpoint's run trained
            on, where it was written by the checkpoint's frozen encoder and holds every image
            of the split (else the images are encoded, and a line says why); images: always
            encode the images.
        decoding: decoding options; each not given is the checkpoint's own.
        batch_size: images per batch.
        device: torch device: cpu, cuda, cuda:1, ... (default: cuda when available, else cpu).
        progress: show progress bars.
        metrics: comma-separated subset of Bleu,METEOR,ROUGE_L,CIDEr,SPICE,REP (default: all).
        spice_timeout: seconds before SPICE is stopped (default: 10 minutes plus 0.2 s a
            caption, references included).
        out: output folder.
        overwrite: replace the results_SPLIT.json and metrics_SPLIT.json of an earlier
            evaluation of the split in --out (default: refuse).
    """
    from captioner.reporting import report_error
    from eval.metrics.spice_jars import SpiceJarsError

    run = _Evaluation(Path(ckpt), Path(data), Path(images), split, instances, metrics,
                      spice_timeout, Path(out))
    try:
        captioner, options, names = run.check(overwrite, decoding, device, batch_size)
    except (SpiceJarsError, OSError, ValueError) as exc:
        return report_error(PROG, exc)
    return run.evaluate(captioner, options, names, batch_size, progress, features)


class _Evaluation:
    """The inputs and output files of one evaluation; the captions are staged beside an
    earlier evaluation's until the new one is whole."""

    def __init__(self, ckpt, data, images, split, instances, metrics, spice_timeout, out):
        self.ckpt, self.data, self.images, self.split = ckpt, data, images, split
        self.instances, self.metrics, self.spice_timeout = instances, metrics, spice_timeout
        self.results = out / f"results_{split}.json"
        self.metrics_file = out / f"metrics_{split}.json"
        self.staged, self.earlier = self.results, None
        self.written: list[Path] = []
        self.empty: list[int] = []

    def check(self, overwrite, decoding, device, batch_size):
        """Everything checked before a caption is made: the output files, the metrics (SPICE's
        jars), the checkpoint and the decoding options. Returns (captioner, decoding options,
        metric names); raises OSError or ValueError."""
        from captioner.inference.pipeline import open_captioner
        from captioner.model.decoding_options import apply_overrides
        from data_prep.paths import OutputPathError, check_output_dir, check_output_file
        from eval.metrics.scoring import parse_metrics

        check_options_at_least([("batch_size", batch_size, 1)])
        if self.spice_timeout is not None and not 0 < self.spice_timeout < math.inf:
            raise ValueError(f"--spice_timeout must be a finite number > 0, got "
                             f"{self.spice_timeout}")
        check_output_dir(self.results.parent)
        reads = [("checkpoint", self.ckpt), ("dataset file", self.data),
                 *([("instances file", self.instances)] if self.instances else [])]
        for path in (self.results, self.metrics_file):
            check_output_file(path, reads)
        self.earlier = next((path for path in (self.results, self.metrics_file)
                             if path.exists()), None)
        if self.earlier is not None and not overwrite:
            raise OutputPathError(f"{self.earlier}: holds an earlier evaluation of split "
                                  f"{self.split!r}; choose another --out, or pass --overwrite "
                                  "to replace it")
        # An earlier evaluation is replaced only once the new one is whole: until then its
        # captions wait beside it, so a metric that fails (or Ctrl-C) loses neither.
        if self.earlier is not None:
            self.staged = self.results.with_name(f"results_{self.split}.new.json")
        check_output_file(self.staged, reads)
        names = parse_metrics(self.metrics)
        if "SPICE" in names:
            from eval.metrics.spice_jars import locate_spice

            locate_spice()  # fail before decoding, not after
        captioner = open_captioner(self.ckpt, device)
        return captioner, apply_overrides(captioner.decoding, decoding), names

    def evaluate(self, captioner, options, names, batch_size, progress, features) -> int:
        """Caption, score and write; the exit status."""
        from captioner.reporting import report_error, warnings_as_lines
        from data_prep.atomic import write_json
        from data_prep.stop_signals import stops_held
        from eval.metrics.java_tools import JavaToolError
        from eval.metrics.spice_jars import SpiceJarsError

        try:
            with warnings_as_lines():  # e.g. CIDEr undefined on one image: one line
                report = evaluate_captioner(
                    captioner, self.data, self.images, split=self.split,
                    instances=self.instances, options=options, batch_size=batch_size,
                    metrics=names, spice_timeout=self.spice_timeout, progress=progress,
                    on_results=self._keep, features=features,
                    on_features=lambda told: print(f"{PROG}: {told}", file=sys.stderr))
        except (SpiceJarsError, JavaToolError, FileNotFoundError, KeyError, ValueError) as exc:
            if not self.written:  # the inputs: a user error
                return report_error(PROG, exc)
            # The metrics failed (SPICE stopped, say): the work's failure, as in `score`.
            return report_error(PROG, exc, after=f"({self._kept()}; {self._rescore()})",
                                status=1)
        except KeyboardInterrupt:
            if not self.written:
                raise  # nothing kept: captioner.cli's one line
            # Ctrl-C in the metrics (SPICE takes longest): the captions need not be made again.
            print(f"{PROG}: interrupted; {self._kept()} ({self._rescore()})", file=sys.stderr)
            return 130
        with stops_held():  # the captions and their metrics in place together, or neither
            if self.staged != self.results:
                # Never the earlier metrics beside the new captions, even for an instant.
                self.metrics_file.unlink(missing_ok=True)
                self.staged.replace(self.results)
            write_json(self.metrics_file, report.to_dict(), indent=2)
        print(report.summary())
        print(f"\nwrote {self.results} and {self.metrics_file}")
        return 0

    def _keep(self, captions: list[dict]) -> None:
        """Write the captions, before the metrics, which may fail."""
        from data_prep.atomic import write_json
        from data_prep.stop_signals import stops_held
        from data_prep.wording import counted, first_names
        from eval.caption_files import empty_caption_ids

        with stops_held():  # a stop once they are written says where they are
            write_json(self.staged, captions)
            self.written.append(self.staged)
        stale = _metrics_of(self.staged)
        if self.staged != self.results and stale.exists():
            # The scores of earlier staged captions, which these replace (and which would
            # stop the score command a failure below gives).
            stale.unlink()
            print(f"{PROG}: removed {stale}: it scored the earlier new captions that "
                  f"{self.staged} now replaces", file=sys.stderr)
        # An under-trained model writes empty captions; they are scored (every metric gives
        # them 0), as `captioner score --allow-empty` scores them, and said so.
        self.empty.extend(empty_caption_ids({c["image_id"]: c["caption"] for c in captions}))
        if self.empty:
            print(f"warning: scoring {counted(len(self.empty), 'empty caption')} (image ids "
                  f"{first_names(self.empty)})", file=sys.stderr)

    def _kept(self) -> str:
        """Where the captions of an evaluation whose metrics failed or were stopped are kept."""
        if self.earlier is None:
            return f"the captions are kept in {self.staged}"
        return (f"the new captions are kept in {self.staged}, and the earlier evaluation in "
                f"{self.staged.parent} is unchanged")

    def _rescore(self) -> str:
        """How to go on once the captions are staged and their metrics failed or were
        stopped: the score command that scores them into a metrics file beside them
        (``metrics_SPLIT.json``, or ``metrics_SPLIT.new.json`` beside staged new captions;
        the same evaluate command is refused now that they are in --out); empty captions
        allowed where there are some."""
        command = ["captioner", "score", "--results", str(self.staged), "--references",
                   str(self.data), "--split", self.split, "--out", str(_metrics_of(self.staged))]
        if self.metrics != ",".join(ALL_METRICS):
            command += ["--metrics", self.metrics]
        if self.spice_timeout is not None:
            command += ["--spice-timeout", f"{self.spice_timeout:g}"]
        if self.empty:
            command.append("--allow-empty")
        # Quoted for a shell, so that it can be pasted as it is (an --out with a space).
        statistics = ("attention statistics and object metrics" if self.instances
                      else "attention statistics")
        return (f"{shlex.join(command)} scores them; the {statistics} need a new evaluation: "
                "--overwrite")


def _metrics_of(results: Path) -> Path:
    """The metrics file beside the captions file ``results``: ``metrics_SPLIT[.new].json``."""
    return results.with_name(results.name.replace("results_", "metrics_", 1))
