"""Evaluate a trained checkpoint on a Karpathy split: decode, score, analyse attention."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from eval.metrics.scoring import ALL_METRICS
from eval.table import format_table1

if TYPE_CHECKING:
    from captioner.inference.pipeline import Captioner
    from captioner.model.decoding_options import DecodingOptions
    from data_prep.features import FeatureCache


@dataclass
class EvaluationReport:
    """``metrics``: corpus scores (pycocoevalcap names + REP); ``attention``: see
    :func:`eval.attention_stats.attention_statistics`; ``objects``: see
    :func:`eval.metrics.objects.object_statistics` (empty without instances); ``results``: COCO
    results
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
    :func:`eval.metrics.spice.spice_scores` scales it). ``on_results`` gets the COCO results
    (``[{"image_id", "caption"}]``) as soon as the captions are made, before any metric, so
    that a caller can keep them. ``features``: "images" encodes the images; "run" reads the
    features of the feature cache the checkpoint's run trained on instead, where it can stand
    in for the encoder (:func:`run_features`); ``on_features`` gets the line that says which
    (and why not the cache) where the run trained on a cache, before captioning starts."""
    from data_prep.karpathy import load_karpathy
    from eval.attention_stats import attention_statistics
    from eval.metrics.objects import InstanceAnnotations, category_words_for, object_statistics
    from eval.metrics.scoring import compute_metrics

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
    from data_prep.settings_files import read_settings

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

