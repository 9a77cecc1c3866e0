"""All caption metrics of the paper in one call: coco-caption metrics and REP."""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence

import numpy as np

from data_prep.wording import first_names
from eval.coco_metrics import METRICS as COCO_METRICS
from eval.coco_metrics import CaptionScores, score_captions
from eval.rep import rep_per_image, rep_score
from eval.spice import spice_scores

ALL_METRICS: tuple[str, ...] = (*COCO_METRICS, "REP")


def parse_metrics(text: str) -> tuple[str, ...]:
    """ "Bleu,METEOR,REP" -> ("Bleu", "METEOR", "REP"); ValueError naming unknown names."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in ALL_METRICS]
    if unknown or not names:
        given = first_names(unknown) if unknown else repr(text)
        raise ValueError(f"unknown metrics {given}; choose from {','.join(ALL_METRICS)}")
    return names


def compute_metrics(
    hypotheses: Mapping[int, str],
    references: Mapping[int, Sequence[str]],
    metrics: Sequence[str] = ALL_METRICS,
    *,
    spice_timeout: float | None = None,
) -> CaptionScores:
    """``score_captions`` for the coco-caption metrics plus REP (key "REP") computed on the
    same PTB-tokenized, lower-cased captions (per-image "REP": the REP of the image alone, on
    the corpus scale; see :mod:`eval.rep`).

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


def spice_of_systems(
    hypotheses: Mapping[str, Mapping[int, str]],
    references: Mapping[int, Sequence[str]],
    *,
    spice_timeout: float | None = None,
) -> dict[str, tuple[float, dict[int, float]]]:
    """SPICE of several systems' captions in one SPICE run: ``{system: (corpus, {image id:
    score})}``, the values one :func:`compute_metrics` call per system gives, while Java and
    the CoreNLP models load once instead of once per system (about 20 s each on a 2-core CPU).

    ``hypotheses[system][image_id]`` are raw captions of images of ``references``; image ids
    must be >= 0."""
    from eval.coco_metrics import tokenize_for_scoring

    ids = [i for system in hypotheses.values() for i in system]
    if any(i < 0 for i in ids):
        raise ValueError(f"spice_of_systems: image ids must be >= 0, got {min(ids)}")
    # One id space for all systems: system k's image i becomes k * stride + i.
    stride = max(ids, default=0) + 1
    joint_hyps: dict[int, str] = {}
    joint_refs: dict[int, list[str]] = {}
    for k, system in enumerate(hypotheses.values()):
        hyps, refs = tokenize_for_scoring(system, references)
        for i in hyps:
            joint_hyps[k * stride + i] = hyps[i]
            joint_refs[k * stride + i] = refs[i]
    _, details = spice_scores(joint_hyps, joint_refs, timeout=spice_timeout)
    scores = {}
    for k, (name, system) in enumerate(hypotheses.items()):
        per_image = {i: details[k * stride + i]["All"]["f"] for i in system}
        scores[name] = (float(np.mean(list(per_image.values()))), per_image)
    return scores
