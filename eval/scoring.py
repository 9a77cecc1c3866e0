"""All caption metrics of the paper in one call: coco-caption metrics and REP."""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence

from eval.coco_metrics import METRICS as COCO_METRICS
from eval.coco_metrics import CaptionScores, score_captions
from eval.rep import rep_per_image, rep_score

ALL_METRICS: tuple[str, ...] = (*COCO_METRICS, "REP")


def parse_metrics(text: str) -> tuple[str, ...]:
    """ "Bleu,METEOR,REP" -> ("Bleu", "METEOR", "REP"); ValueError naming unknown names."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in ALL_METRICS]
    if unknown or not names:
        raise ValueError(
            f"unknown metrics {unknown or text!r}; choose from {','.join(ALL_METRICS)}"
        )
    return names


def compute_metrics(
    hypotheses: Mapping[int, str],
    references: Mapping[int, Sequence[str]],
    metrics: Sequence[str] = ALL_METRICS,
    *,
    spice_timeout: float | None = None,
) -> CaptionScores:
    """``score_captions`` for the coco-caption metrics plus REP (key "REP") computed on the
    same PTB-tokenized, lower-cased captions (per-image "REP" = rep_i, unnormalized).

    Corpus REP is NaN, with a warning, when every hypothesis is empty (an untrained model):
    it is undefined then, and the other metrics are still worth reporting."""
    coco = [m for m in metrics if m != "REP"]
    scores = score_captions(hypotheses, references, coco, spice_timeout=spice_timeout)
    if "REP" in metrics:
        ids = list(scores.tokenized_hypotheses)
        hyps = [scores.tokenized_hypotheses[i] for i in ids]
        refs = [scores.tokenized_references[i] for i in ids]
        if any(hyp.split() for hyp in hyps):
            scores.corpus["REP"] = rep_score(hyps, refs)
        else:
            warnings.warn("REP is undefined (NaN): every caption is empty", stacklevel=2)
            scores.corpus["REP"] = math.nan
        for image_id, value in zip(ids, rep_per_image(hyps, refs), strict=True):
            scores.per_image[image_id]["REP"] = value
    return scores
