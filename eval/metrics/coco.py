"""The coco-caption metrics (Bleu_1..4, METEOR, ROUGE_L, CIDEr, SPICE) through pycocoevalcap.

Follows ``pycocoevalcap.eval.COCOEvalCap.evaluate``: PTB-tokenize hypotheses and references
(:mod:`eval.metrics.ptb`, sanitized, in a temporary directory), then call pycocoevalcap's scorers on
the tokenized captions; SPICE runs through :mod:`eval.metrics.spice` (Java 17 ready). CIDEr here is
pycocoevalcap's ``Cider`` (CIDEr-D, document frequencies from the evaluated references). Its
IDF weights log(N / df) are all 0 when the references hold N = 1 image, so pycocoevalcap
returns 0 there even for a caption equal to its reference: with fewer than 2 images CIDEr
(corpus and per image) is reported as NaN, with a warning, instead (:mod:`captioner.cider`).
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from data_prep.wording import agreeing, counted, first_names

if TYPE_CHECKING:
    from eval.metrics.spice_jars import SpiceInstall

METRICS: tuple[str, ...] = ("Bleu", "METEOR", "ROUGE_L", "CIDEr", "SPICE")
BLEU_KEYS: tuple[str, ...] = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4")


@dataclass
class CaptionScores:
    """``corpus[name]``: corpus score under pycocoevalcap's method name (Bleu_1..Bleu_4,
    METEOR, ROUGE_L, CIDEr, SPICE), raw (not x100); ``per_image[image_id][name]``: the
    per-image score; ``tokenized``: the PTB-tokenized hypotheses and references used."""

    corpus: dict[str, float]
    per_image: dict[int, dict[str, float]]
    tokenized_hypotheses: dict[int, str] = field(default_factory=dict)
    tokenized_references: dict[int, list[str]] = field(default_factory=dict)

    def to_dict(self, info: dict) -> dict:
        """The METRICS.json document: the corpus scores, ``per_image`` (keys are image ids as
        strings) and ``info`` (what was scored)."""
        return {**self.corpus, "per_image": {str(i): s for i, s in self.per_image.items()},
                "info": info}


def coverage_problems(hypotheses: Mapping[int, str],
                      references: Mapping[int, Sequence[str]]) -> list[str]:
    """What stops scoring ``hypotheses`` against ``references``: image ids in one and not in
    the other (the first 10 of each kind named)."""
    problems = []
    only_hyp = sorted(set(hypotheses) - set(references))
    only_ref = sorted(set(references) - set(hypotheses))
    if only_hyp:
        problems.append(f"{counted(len(only_hyp), 'image id')} of the results "
                        f"{agreeing(len(only_hyp), 'has', 'have')} no reference caption "
                        f"({first_names(only_hyp)})")
    if only_ref:
        problems.append(f"{counted(len(only_ref), 'image id')} of the references "
                        f"{agreeing(len(only_ref), 'has', 'have')} no caption in the results "
                        f"({first_names(only_ref)})")
    return problems


def _check_inputs(hypotheses: Mapping[int, str], references: Mapping[int, Sequence[str]]) -> None:
    if not hypotheses:
        raise ValueError("no hypotheses to score")
    problems = coverage_problems(hypotheses, references)
    if problems:
        raise ValueError("; ".join(problems))
    for image_id, refs in references.items():
        if isinstance(refs, str) or len(refs) == 0:
            raise ValueError(f"image {image_id}: references must be a non-empty list of str")


def _check_metrics(metrics: Sequence[str]) -> None:
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise ValueError(f"unknown metrics {first_names(unknown)}; valid: {', '.join(METRICS)}")


def tokenize_for_scoring(
    hypotheses: Mapping[int, str], references: Mapping[int, Sequence[str]]
) -> tuple[dict[int, str], dict[int, list[str]]]:
    """PTB-tokenize hypotheses and references in one JVM (image order of ``hypotheses``)."""
    from eval.metrics.ptb import ptb_tokenize

    joint = {("hyp", i): [hypotheses[i]] for i in hypotheses}
    joint.update({("ref", i): list(references[i]) for i in hypotheses})
    tokenized = ptb_tokenize(joint)
    return (
        {i: tokenized[("hyp", i)][0] for i in hypotheses},
        {i: tokenized[("ref", i)] for i in hypotheses},
    )


# pycocoevalcap's METEOR command (Meteor.__init__), run by start_java so that the JVM dies with
# this process; the scorer's own protocol code then talks to it.
_METEOR_ARGS = ("-jar", "-Xmx2G", "meteor-1.5.jar", "-", "-", "-stdio", "-l", "en", "-norm")


def _meteor(gts: dict[int, list[str]], res: dict[int, list[str]]) -> tuple[float, list[float]]:
    """pycocoevalcap's METEOR, its JVM started to die with this process and always stopped
    (its __del__ deadlocks on the lock if scoring raised, which leaves the interpreter hanging
    at exit).

    Raises:
        JavaToolError: the JVM ended while scoring (killed from outside, as the OOM killer
            does): a broken pipe or an empty answer, in one line naming METEOR.
    """
    import threading

    from pycocoevalcap.meteor import meteor as module

    from eval.metrics.java_tools import JavaToolError, how_it_ended, start_java

    meteor = module.Meteor.__new__(module.Meteor)
    meteor.lock = threading.Lock()
    meteor.meteor_p = start_java(_METEOR_ARGS, cwd=Path(module.__file__).parent)
    try:
        return meteor.compute_score(gts, res)
    except (OSError, ValueError) as exc:  # a broken pipe, or float(b"") of no answer
        try:
            ended = meteor.meteor_p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            raise exc from None  # the JVM runs on: not its death
        raise JavaToolError(f"METEOR: its Java process ended while scoring "
                            f"({how_it_ended(ended)}); no METEOR score was made") from None
    finally:
        if meteor.lock.locked():
            meteor.lock.release()
        meteor.meteor_p.kill()
        meteor.meteor_p.wait()
        try:
            meteor.meteor_p.stdin.close()  # what its __del__ would flush into a dead pipe
        except BrokenPipeError:
            pass


def score_captions(
    hypotheses: Mapping[int, str],
    references: Mapping[int, Sequence[str]],
    metrics: Sequence[str] = METRICS,
    *,
    spice_install: SpiceInstall | None = None,
    spice_timeout: float | None = None,
) -> CaptionScores:
    """Score ``hypotheses[image_id]`` against ``references[image_id]`` (raw captions).

    ``metrics`` picks among "Bleu" (gives Bleu_1..Bleu_4), "METEOR", "ROUGE_L", "CIDEr",
    "SPICE". Both mappings must have the same ids and every image at least one reference.
    SPICE needs ``captioner fetch-spice`` first (SpiceJarsError otherwise, checked before any
    other metric runs). ``spice_install`` overrides the installation found in the cache.
    CIDEr of a single image is NaN (corpus and per image) with a UserWarning saying why."""
    _check_metrics(metrics)
    _check_inputs(hypotheses, references)
    if "SPICE" in metrics and spice_install is None:
        from eval.metrics.spice_jars import locate_spice

        spice_install = locate_spice()
    hyps, refs = tokenize_for_scoring(hypotheses, references)
    res = {i: [hyps[i]] for i in hyps}
    gts = {i: refs[i] for i in hyps}
    ids = list(gts)
    corpus: dict[str, float] = {}
    per_image: dict[int, dict[str, float]] = {i: {} for i in ids}

    def record(name: str, score: float, scores: Sequence[float]) -> None:
        corpus[name] = float(score)
        for image_id, value in zip(ids, scores, strict=True):
            per_image[image_id][name] = float(value)

    if "Bleu" in metrics:
        from pycocoevalcap.bleu.bleu import Bleu

        score, scores = Bleu(4).compute_score(gts, res, verbose=0)
        for name, s, ss in zip(BLEU_KEYS, score, scores, strict=True):
            record(name, s, ss)
    if "METEOR" in metrics:
        record("METEOR", *_meteor(gts, res))
    if "ROUGE_L" in metrics:
        from pycocoevalcap.rouge.rouge import Rouge

        record("ROUGE_L", *Rouge().compute_score(gts, res))
    if "CIDEr" in metrics:
        from captioner.cider import cider_d

        record("CIDEr", *cider_d(gts, res))
    if "SPICE" in metrics:
        from eval.metrics.spice import spice_scores

        score, details = spice_scores(hyps, gts, install=spice_install, timeout=spice_timeout)
        record("SPICE", score, [details[i]["All"]["f"] for i in ids])
    return CaptionScores(corpus, per_image, hyps, gts)
