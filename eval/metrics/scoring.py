"""All caption metrics of the paper in one call: coco-caption metrics and REP."""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from data_prep.atomic import write_json
from data_prep.paths import check_output_file
from data_prep.wording import agreeing, counted, first_names
from eval.metrics.coco import METRICS as COCO_METRICS
from eval.metrics.coco import CaptionScores, score_captions
from eval.metrics.rep import rep_per_image, rep_score
from eval.metrics.spice import spice_scores

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
    the corpus scale; see :mod:`eval.metrics.rep`).

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
    from eval.metrics.coco import tokenize_for_scoring

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


PROG = "captioner score"


def score_results_file(
    results: Path,
    references: Path,
    split: str | None = None,
    metrics: str = ",".join(ALL_METRICS),
    spice_timeout: float | None = None,
    out: Path | None = None,
    overwrite: bool = False,
    allow_empty: bool = False,
) -> int:
    """Score a COCO results file against its references and print the metrics; the exit
    status: 0, 2 for a user error (one line, nothing scored), 1 when the scoring failed.

    Args:
        results: COCO results JSON: [{"image_id": int, "caption": str}].
        references: COCO captions annotation JSON, or a Karpathy JSON together with --split.
        split: split of a Karpathy references file (train/val/test).
        metrics: comma-separated subset of Bleu,METEOR,ROUGE_L,CIDEr,SPICE,REP (default: all).
        spice_timeout: seconds before SPICE is stopped (default: 10 minutes plus 0.2 s a
            caption, references included).
        out: write METRICS.json here (checked before scoring, written atomically).
        overwrite: replace an existing --out file (default: refuse it).
        allow_empty: score empty captions (no words: punctuation alone counts as none; every
            metric gives them 0) instead of refusing them.
    """
    from captioner.reporting import report_error, warnings_as_lines
    from eval.metrics.java_tools import JavaToolError
    from eval.metrics.spice_jars import SpiceJarsError

    try:
        names, hypotheses, reference_file, notes = _scoring_inputs(
            Path(results), Path(references), split, metrics, spice_timeout, out, overwrite)
    except (OSError, KeyError, ValueError) as exc:  # CaptionFileError is a ValueError
        return report_error(PROG, exc)
    try:
        hypotheses, refs, notes = _scored_images(hypotheses, reference_file, split, results,
                                                 references, allow_empty, notes)
    except ValueError as exc:
        return report_error(PROG, exc, f"cannot score {results}")
    for note in notes:
        print(note, file=sys.stderr)
    try:
        # Metrics that are undefined here (e.g. CIDEr of one image) warn: one line each.
        with warnings_as_lines():
            scores = compute_metrics(hypotheses, refs, names, spice_timeout=spice_timeout)
    except SpiceJarsError as exc:
        others = ",".join(name for name in names if name != "SPICE")
        leave_out = f"; or score without SPICE: --metrics {others}" if others else ""
        exc.args = (f"{exc}{leave_out}",)  # the hint on the same line; the traceback kept
        return report_error(PROG, exc)
    except (JavaToolError, RuntimeError, ValueError) as exc:
        return report_error(PROG, exc, status=1)
    _print_scores(scores, len(hypotheses), results)
    if out is None:
        return 0
    document = scores.to_dict({"results": str(results), "references": str(references),
                               "split": split, "num_images": len(scores.per_image)})
    try:
        write_json(out, document, indent=2)
    except OSError as exc:
        return report_error(PROG, exc, f"could not write {out}", status=1)
    print(f"\nwrote {out}")
    return 0


def _scoring_inputs(results: Path, references: Path, split: str | None, metrics: str,
                    spice_timeout: float | None, out: Path | None, overwrite: bool):
    """What ``score_results_file`` checks before reading a caption: --out, the metrics, the
    SPICE timeout, the two files and their image names. Returns (metric names, the results'
    captions by image id, the references file, notes for the user); raises OSError, KeyError
    or ValueError (CaptionFileError)."""
    from eval.caption_files import check_result_names, load_references, load_results

    if out is not None:
        check_output_file(out, [("results file", results), ("references file", references)],
                          overwrite=overwrite)
    names = parse_metrics(metrics)
    if spice_timeout is not None and not 0 < spice_timeout < math.inf:
        raise ValueError(f"--spice_timeout must be a finite number > 0, got {spice_timeout}")
    loaded = load_results(str(results))
    reference_file = load_references(str(references), split)
    unchecked = check_result_names(results, loaded.file_names, references,
                                   reference_file.file_names)
    return names, loaded.captions, reference_file, [unchecked] if unchecked else []


def _scored_images(hypotheses: dict, reference_file, split: str | None, results: Path,
                   references: Path, allow_empty: bool, notes: list[str]):
    """The captions and references to score (those of the results' images in a whole COCO
    set; those of the split asked for when the results hold others too), with the notes and
    warnings to print. Raises ValueError naming every problem: an image without a caption or
    references, an empty caption (unless ``allow_empty``)."""
    from eval.caption_files import empty_caption_ids
    from eval.metrics.coco import coverage_problems

    refs, elsewhere = reference_file.captions, {}
    if split is None and set(refs) - set(hypotheses):
        # A COCO captions file holds a whole set (val2014: 40,504 images), of which Karpathy's
        # test split is a part: as coco-caption does, the results' images are scored. A split
        # of a Karpathy file is the set itself, so each of its images needs a caption.
        notes.append(f"scoring the {counted(len(hypotheses), 'image')} of {results}; "
                     f"{references} holds references of {len(refs)}")
        refs = {i: texts for i, texts in refs.items() if i in hypotheses}
    elif split is not None and set(hypotheses) - set(refs):
        # Captions of a whole folder (val and test images, say) scored on one split: its
        # images are scored, as asked; ids the file does not list at all stay an error.
        elsewhere = {i: reference_file.other_splits[i] for i in set(hypotheses) - set(refs)
                     if i in reference_file.other_splits}
        if elsewhere:
            notes.append(f"scoring the {counted(len(refs), 'image')} of split {split!r}; the "
                         f"captions of {counted(len(elsewhere), 'image')} of other splits in "
                         f"{results} are left out (image ids {first_names(sorted(elsewhere))})")
            hypotheses = {i: text for i, text in hypotheses.items() if i not in elsewhere}
    problems = coverage_problems(hypotheses, refs)
    empty = empty_caption_ids(hypotheses)
    if empty and not allow_empty:
        problems.append(f"{counted(len(empty), 'caption')} in {results} "
                        f"{agreeing(len(empty), 'is', 'are')} empty, without a word (image ids "
                        f"{first_names(empty)}); pass --allow-empty to score them anyway")
    if problems and elsewhere and not hypotheses:
        # Every caption was of another split: the split given is likely not the results'.
        found = sorted(set(elsewhere.values()))
        problems.append(f"every caption in {results} is of split "
                        f"{' or '.join(map(repr, found))}, not {split!r}: is --split right?")
    if problems:
        raise ValueError("; ".join(problems))
    if empty:
        notes.append(f"warning: scoring {counted(len(empty), 'empty caption')} (image ids "
                     f"{first_names(empty)})")
    # An empty reference is a defect of the references file; it counts as one (lowering
    # CIDEr's consensus, say), so the user must hear of it.
    empty_references = sorted(i for i, texts in refs.items()
                              if i in hypotheses and any(not t.strip() for t in texts))
    if empty_references:
        notes.append(f"warning: {counted(len(empty_references), 'image')} of {references} "
                     f"{agreeing(len(empty_references), 'has', 'have')} an empty reference "
                     f"caption (image ids {first_names(empty_references)}), scored as a "
                     "reference")
    return hypotheses, refs, notes


def _print_scores(scores: CaptionScores, num_images: int, results: Path) -> None:
    from eval.table import format_table1

    print(counted(num_images, "image"))
    for name, value in scores.corpus.items():
        print(f"{name:>8}: {value:.4f}")
    print()
    print(format_table1({Path(results).stem: scores.corpus}))
