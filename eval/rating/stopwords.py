"""English stop words for the human study's attention plots.

Martins et al. (appendix B) show raters the attention plots of the *non stop words* of each
caption: the content words (objects, attributes, actions) whose attended region a person can
judge. This list holds the function words of caption English (articles, pronouns,
prepositions, conjunctions, auxiliaries and forms of "be"/"have"/"do", quantifier-like
determiners) plus the decoder's special tokens; content words such as colours, numbers of
objects and verbs stay.
"""

from __future__ import annotations

STOP_WORDS = frozenset(
    """
    a an the this that these those there here
    i me my we us our you your he him his she her it its they them their
    and or but nor so yet if then than as while
    of in on at by for with without from to into onto over under above below near
    up down out off about across along around through between behind beside besides
    against among during before after inside outside upon within toward towards via
    is are was were be been being am 's
    has have had having do does did doing
    will would can could should may might must shall
    not no very too also just only some any each other another such own same
    what which who whom whose where when why how
    <unk> <pad> <start> <end>
    """.split()
)


def content_word_indices(tokens: list[str]) -> list[int]:
    """Positions of the non-stop words of a caption (case-insensitive); punctuation excluded."""
    return [
        i
        for i, token in enumerate(tokens)
        if token.lower() not in STOP_WORDS and any(ch.isalnum() for ch in token)
    ]
