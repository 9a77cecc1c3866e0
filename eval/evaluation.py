"""Evaluate a trained checkpoint on a Karpathy split: decode, score, analyse attention."""

from __future__ import annotations

import math
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from captioner.decoding_options import DecodingOverrides
from eval.scoring import ALL_METRICS
from eval.table import format_table1

if TYPE_CHECKING:
    from captioner.decoding_options import DecodingOptions
    from captioner.inference import Captioner
    from data_prep.features import FeatureCache


@dataclass
class EvaluationReport:
    """``metrics``: corpus scores (pycocoevalcap names + REP); ``attention``: see
    :func:`eval.attention_stats.attention_statistics`; ``objects``: see
    :func:`eval.objects.object_statistics` (empty without instances); ``results``: COCO results
    entries; ``per_image``: per-image metric scores; ``info``: what was evaluated."""

    metrics: dict[str, float]
    attention: dict[str, float]
    objects: dict[str, float]
    results: list[dict]
    per_image: dict[int, dict[str, float]]
    info: dict = field(default_factory=dict)

    def summary(self) -> str:
        """The scores in the paper's Table 1 layout, then the attention and object
        statistics, one per line."""
        name = f"{self.info['output_attention']} ({self.info['split']})"
        lines = [format_table1({name: self.metrics}), "", "attention statistics:"]
        lines += [f"  {key:<20} {_statistic(value)}" for key, value in self.attention.items()]
        if self.objects:
            lines += ["objects:"]
            width = max(map(len, self.objects))
            lines += [f"  {key:<{width}} {_statistic(value)}"
                      for key, value in self.objects.items()]
            if any(math.isnan(value) for value in self.objects.values()):
                lines += ["  (n/a: undefined here, as no image holds an object of the "
                          "instances file, or no caption names one its image holds)"]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            **self.metrics,
            "attention": self.attention,
            "objects": self.objects,
            "per_image": {str(i): s for i, s in self.per_image.items()},
            "info": self.info,
        }


def evaluate_captioner(
    captioner: Captioner,
    karpathy_json: str | Path,
    image_root: str | Path,
    *,
    split: str = "test",
    instances: str | Path | None = None,
    options: DecodingOptions | None = None,
    batch_size: int = 16,
    metrics: Sequence[str] = ALL_METRICS,
    spice_timeout: float | None = None,
    progress: bool = True,
    on_results: Callable[[list[dict]], None] | None = None,
    features: str = "images",
    on_features: Callable[[str], None] | None = None,
) -> EvaluationReport:
    """Caption every image of ``split`` with ``captioner`` (decoding ``options``, default: the
    checkpoint's own) and report the caption metrics against the split's raw references, the
    output-attention statistics and, with a COCO ``instances`` file, object mentions and
    attention precision. ``spice_timeout``: seconds before SPICE is stopped (default: as
    :func:`eval.spice.spice_scores` scales it). ``on_results`` gets the COCO results
    (``[{"image_id", "caption"}]``) as soon as the captions are made, before any metric, so
    that a caller can keep them. ``features``: "images" encodes the images; "run" reads the
    features of the feature cache the checkpoint's run trained on instead, where it can stand
    in for the encoder (:func:`run_features`); ``on_features`` gets the line that says which
    (and why not the cache) where the run trained on a cache, before captioning starts."""
    from data_prep.karpathy import load_karpathy
    from eval.attention_stats import attention_statistics
    from eval.objects import InstanceAnnotations, category_words_for, object_statistics
    from eval.scoring import compute_metrics

    entries = load_karpathy(karpathy_json, image_root).split(split)
    if not entries:
        raise ValueError(f"{karpathy_json}: split {split!r} has no images")
    annotations = None
    if instances is not None:  # checked before hours of captioning, not after
        annotations = InstanceAnnotations.load(instances, {e.image_id: e.path for e in entries})
        try:
            category_words_for(annotations.category_names)  # a synonym list for each
        except KeyError as exc:
            raise ValueError(f"{instances}: {exc.args[0]}") from None
    options = options or captioner.decoding
    ids = [entry.image_id for entry in entries]
    cache, told = run_features(captioner, ids) if features == "run" else (None, None)
    if on_features is not None and told is not None:
        on_features(told)
    if cache is not None:
        with cache:
            captions = captioner.caption_cached(cache, ids, options, batch_size=batch_size,
                                                progress=progress)
    else:
        captions = captioner.caption([entry.path for entry in entries], options,
                                     batch_size=batch_size, progress=progress)
    hypotheses = {i: c.text for i, c in zip(ids, captions, strict=True)}
    results = [{"image_id": i, "caption": hypotheses[i]} for i in ids]
    if on_results is not None:
        on_results(results)
    references = {entry.image_id: list(entry.raws) for entry in entries}
    scores = compute_metrics(hypotheses, references, metrics, spice_timeout=spice_timeout)
    objects = (
        object_statistics(
            {i: c.tokens for i, c in zip(ids, captions, strict=True)},
            {i: c.attention for i, c in zip(ids, captions, strict=True)},
            annotations,
        )
        if annotations is not None
        else {}
    )
    return EvaluationReport(
        metrics=scores.corpus,
        attention=attention_statistics([c.attention for c in captions]),
        objects=objects,
        results=results,
        per_image=scores.per_image,
        info={
            "checkpoint": str(captioner.checkpoint),
            "data": str(karpathy_json),
            "split": split,
            "num_images": len(ids),
            "output_attention": captioner.output_attention_name,
            "decoding": asdict(options),
            "instances": None if instances is None else str(instances),
            "features": "images" if cache is None else str(cache.path),
        },
    )


def run_features(captioner: Captioner,
                 image_ids: Sequence[int]) -> tuple[FeatureCache | None, str | None]:
    """The feature cache the checkpoint's run trained on (``data.feature_cache`` of the
    ``config.yaml`` beside its ``checkpoints/`` folder, as fit writes them, a relative path
    read from the working folder, as fit read it), when it holds every image of ``image_ids``
    and was written by the checkpoint's frozen encoder; else None. With it, one line saying
    which features the evaluation reads and, where it encodes the images, why; None where
    there was no cache to read (a checkpoint outside a run folder, a run without a cache)."""
    from data_prep.features import FeatureCache
    from data_prep.files import read_settings

    checkpoint = Path(captioner.checkpoint).resolve()
    config = checkpoint.parent.parent / "config.yaml"
    if checkpoint.parent.name != "checkpoints" or not config.is_file():
        return None, None
    try:  # a run's files are untrusted: read within every settings file's limits
        data = read_settings(config, "config").get("data") or {}
        cached = data.get("feature_cache")
    except (OSError, ValueError, AttributeError):
        return None, f"features: encoding the images ({config} cannot be read)"
    if not isinstance(cached, str) or not cached:
        return None, None
    if not Path(cached).is_file():
        return None, f"features: encoding the images (the run's feature cache {cached} is gone)"
    try:
        cache = FeatureCache(cached)
    except (OSError, ValueError) as exc:
        return None, f"features: encoding the images (the run's feature cache: {exc})"
    problem = captioner.cache_problem(cache, image_ids)
    if problem is not None:
        cache.close()
        return None, f"features: encoding the images ({' '.join(problem.split())})"
    return cache, (f"features: the run's cache {cached}, written by this checkpoint's frozen "
                   "encoder (--features images encodes the images instead)")


def _statistic(value: float) -> str:
    """A statistic for the summary: four decimals, or n/a where it is undefined (NaN)."""
    return "n/a" if math.isnan(value) else f"{value:.4f}"


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
    from captioner.commands.options import report_error
    from eval.spice_jars import SpiceJarsError

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
        from captioner.decoding_options import apply_overrides
        from captioner.inference import open_captioner
        from data_prep.files import OutputPathError, check_output_dir, check_output_file
        from eval.scoring import parse_metrics

        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if self.spice_timeout is not None and not 0 < self.spice_timeout < math.inf:
            raise ValueError(f"spice_timeout must be a finite number > 0, got "
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
            from eval.spice_jars import locate_spice

            locate_spice()  # fail before decoding, not after
        captioner = open_captioner(self.ckpt, device)
        return captioner, apply_overrides(captioner.decoding, decoding), names

    def evaluate(self, captioner, options, names, batch_size, progress, features) -> int:
        """Caption, score and write; the exit status."""
        from captioner.commands.options import report_error, warnings_as_lines
        from data_prep.files import stops_held, write_json
        from eval.java_tools import JavaToolError
        from eval.spice_jars import SpiceJarsError

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
        from data_prep.files import counted, first_names, stops_held, write_json
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
