"""CIDEr-D as pycocoevalcap computes it, defined for a single image too.

pycocoevalcap's ``Cider`` takes its document frequencies from the evaluated references, so its
IDF weights log(N / df) are all 0 when the references hold N = 1 image and it returns 0 there,
even for a caption equal to its reference. :func:`cider_d` reports NaN instead, with a warning
saying why. Used by validation (:mod:`captioner.training.module`) and by ``eval``'s metrics.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence


def cider_d(
    references: Mapping[int, Sequence[str]], hypotheses: Mapping[int, Sequence[str]]
) -> tuple[float, list[float]]:
    """Corpus and per-image CIDEr-D (per-image scores in the order of ``hypotheses``) of
    tokenized captions: ``references`` and ``hypotheses`` map each image id to its reference
    strings and to a one-element list with its caption, as pycocoevalcap's scorers take them.
    Fewer than 2 images give NaN, with a UserWarning."""
    if len(hypotheses) < 2:
        warnings.warn(
            "CIDEr is undefined (NaN) for a single image: its IDF weights log(N/df), taken "
            "from the references of the N images scored, are 0 when N = 1",
            stacklevel=2,
        )
        return math.nan, [math.nan] * len(hypotheses)
    from pycocoevalcap.cider.cider import Cider

    corpus, per_image = Cider().compute_score(dict(references), dict(hypotheses))
    return float(corpus), [float(score) for score in per_image]
