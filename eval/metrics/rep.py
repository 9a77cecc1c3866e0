"""REP, the repetition score of Malaviya et al. (2018), "Sparse and Constrained Attention for
Neural Machine Translation", section 4, with n = 2, w1 = 1, w2 = 2 (definition in DESIGN.md,
"Metrics"). Lower is better.

For hypothesis h with references R (the image's first m references, m = the smallest number
of references any image has):

    ngram(h, r)  = sum over bigrams g with count_h(g) > 1 of max(0, count_h(g) - count_r(g))
    consec(h, r) = sum over bigrams (w, w) in h of max(0, count_h((w, w)) - count_r((w, w)))
    rep_i        = w1 * min_r ngram(h, r) + w2 * min_r consec(h, r)

Corpus: L_hyp = total hypothesis words; L_j = total words of the j-th references; L_ref = the
L_j minimizing L_j - L_hyp (signed, as in the original script, i.e. the shortest reference
set); BP = exp(L_ref / L_hyp - 1) if L_hyp < L_ref else 1;
REP = BP * 100 * sum_i rep_i / L_ref.

Per image (`rep_per_image`): the same formula on the image alone (a corpus of one image, with
the corpus's m), so that per-image and corpus values share one scale (x100, normalized by
length); NaN where it is undefined (an empty caption or reference). The corpus REP pools
counts and lengths over images, so it is not the mean of the per-image values, as corpus BLEU
is not the mean of per-image BLEU.

The functions split captions on whitespace; ``captioner score`` passes PTB-tokenized,
lower-cased captions.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

NGRAM_WEIGHT = 1.0
CONSECUTIVE_WEIGHT = 2.0


def _bigrams(words: Sequence[str]) -> Counter[tuple[str, str]]:
    return Counter(zip(words, words[1:], strict=False))


def _ngram_excess(hyp: Counter[tuple[str, str]], ref: Counter[tuple[str, str]]) -> int:
    return sum(max(0, n - ref[g]) for g, n in hyp.items() if n > 1)


def _consecutive_excess(hyp: Counter[tuple[str, str]], ref: Counter[tuple[str, str]]) -> int:
    return sum(max(0, n - ref[g]) for g, n in hyp.items() if g[0] == g[1])


def _check(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> int:
    """Validate inputs and return m, the smallest number of references per image."""
    if isinstance(hypotheses, str) or len(hypotheses) != len(references):
        raise ValueError(
            f"need one list of references per hypothesis: {len(hypotheses)} hypotheses, "
            f"{len(references)} reference lists"
        )
    if not hypotheses:
        raise ValueError("REP needs at least one hypothesis")
    for index, refs in enumerate(references):
        if isinstance(refs, str) or len(refs) == 0:
            raise ValueError(f"image {index}: references must be a non-empty list of strings")
    return min(len(refs) for refs in references)


def _repetitions(hypotheses: Sequence[str], references: Sequence[Sequence[str]],
                 m: int) -> list[float]:
    """rep_i of each hypothesis: the weighted excess-repetition count (>= 0) against the first
    ``m`` references, before any normalization."""
    scores = []
    for hyp, refs in zip(hypotheses, references, strict=True):
        hyp_bigrams = _bigrams(hyp.split())
        ref_bigrams = [_bigrams(r.split()) for r in refs[:m]]
        ngram = min(_ngram_excess(hyp_bigrams, r) for r in ref_bigrams)
        consec = min(_consecutive_excess(hyp_bigrams, r) for r in ref_bigrams)
        scores.append(NGRAM_WEIGHT * ngram + CONSECUTIVE_WEIGHT * consec)
    return scores


def _normalized(repetitions: float, hyp_length: int, ref_lengths: Sequence[int]) -> float:
    """BP * 100 * repetitions / L_ref (module docstring); NaN when the caption or the chosen
    reference set has no words, where the formula divides by zero."""
    ref_length = min(ref_lengths, key=lambda length: length - hyp_length)
    if hyp_length == 0 or ref_length == 0:
        return math.nan
    brevity = math.exp(ref_length / hyp_length - 1) if hyp_length < ref_length else 1.0
    return brevity * 100.0 * repetitions / ref_length


def _length(text: str) -> int:
    return len(text.split())


def rep_per_image(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> list[float]:
    """REP of each hypothesis alone, on the corpus scale (x100, brevity factor, the corpus's
    m references); NaN for an empty caption or reference. Per-image JSON sits beside the
    corpus REP: a raw count there would read as a score about 1/100 of the corpus one.

    ``hypotheses[i]`` is a caption, ``references[i]`` the list of its reference captions."""
    m = _check(hypotheses, references)
    return [
        _normalized(rep, _length(hyp), [_length(ref) for ref in refs[:m]])
        for rep, hyp, refs in zip(_repetitions(hypotheses, references, m), hypotheses,
                                  references, strict=True)
    ]


def rep_score(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """Corpus REP (x100, with the brevity factor); see the module docstring."""
    m = _check(hypotheses, references)
    hyp_length = sum(_length(h) for h in hypotheses)
    if hyp_length == 0:
        raise ValueError("REP is undefined when every hypothesis is empty")
    ref_lengths = [sum(_length(refs[j]) for refs in references) for j in range(m)]
    score = _normalized(sum(_repetitions(hypotheses, references, m)), hyp_length, ref_lengths)
    if math.isnan(score):
        raise ValueError("REP is undefined when the reference set has no words")
    return score
