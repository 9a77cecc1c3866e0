"""Word vocabulary of the caption decoder.

Built from the training captions with a minimum count (5 by convention for COCO and Flickr30k,
as in the Show, Attend and Tell line of work the TVmax paper builds on); rarer words map to
``<unk>``. The vocabulary travels inside every checkpoint through :meth:`Vocabulary.to_dict`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from data_prep.text import printable, unsafe_character
from data_prep.wording import first_names

PAD = "<pad>"
START = "<start>"
END = "<end>"
UNK = "<unk>"
SPECIALS: tuple[str, ...] = (PAD, START, END, UNK)
PAD_ID, START_ID, END_ID, UNK_ID = range(len(SPECIALS))

_FORMAT = "captioner.vocabulary"
_VERSION = 1


def word_counts(token_lists: Iterable[Sequence[str]]) -> Counter[str]:
    """How often each word occurs in ``token_lists`` (one token sequence per caption);
    special-token strings in the data are not counted."""
    counts = Counter(token for tokens in token_lists for token in tokens)
    for special in SPECIALS:
        counts.pop(special, None)
    return counts


class Vocabulary:
    """Bijection between words and ids; ids 0-3 are ``<pad>``, ``<start>``, ``<end>``,
    ``<unk>``, then words by decreasing training frequency (ties alphabetically), so that the
    same captions always give the same ids."""

    PAD, START, END, UNK = PAD, START, END, UNK
    PAD_ID, START_ID, END_ID, UNK_ID = PAD_ID, START_ID, END_ID, UNK_ID

    def __init__(self, itos: Sequence[str]):
        itos = list(itos)
        if tuple(itos[: len(SPECIALS)]) != SPECIALS:
            raise ValueError(
                f"vocabulary must start with the special tokens {list(SPECIALS)}, "
                f"got {itos[: len(SPECIALS)]}"
            )
        for index, word in enumerate(itos):
            # Whitespace inside would split the word in every caption written with it.
            if not isinstance(word, str) or not word or any(c.isspace() for c in word):
                raise ValueError(f"vocabulary word {index} must be a non-empty word without "
                                 f"whitespace, got {word!r}")
            # A word is written raw into every caption shown on a terminal.
            unsafe = unsafe_character(word)
            if unsafe is not None:
                raise ValueError(f"vocabulary word {index} holds the control character "
                                 f"U+{ord(unsafe):04X} ('{printable(word)}'); a vocabulary holds "
                                 "words of letters, digits and marks")
        stoi = {word: index for index, word in enumerate(itos)}
        if len(stoi) != len(itos):
            duplicates = sorted(word for word, count in Counter(itos).items() if count > 1)
            raise ValueError(f"vocabulary has duplicate words: {first_names(duplicates)}")
        self.itos: list[str] = itos
        self.stoi: dict[str, int] = stoi

    @classmethod
    def build(cls, token_lists: Iterable[Sequence[str]], min_count: int = 5) -> Vocabulary:
        """Vocabulary of the words occurring at least ``min_count`` times in ``token_lists``
        (one token sequence per caption). Special-token strings in the data are not counted."""
        return cls.from_counts(word_counts(token_lists), min_count)

    @classmethod
    def from_counts(cls, counts: Mapping[str, int], min_count: int = 5) -> Vocabulary:
        """Vocabulary of the words of ``counts`` (:func:`word_counts`) with at least
        ``min_count``, the most frequent first."""
        if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 1:
            raise ValueError(f"min_count must be a positive integer, got {min_count!r}")
        words = sorted(
            (word for word, count in counts.items() if count >= min_count),
            key=lambda word: (-counts[word], word),
        )
        return cls([*SPECIALS, *words])

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, word: object) -> bool:
        return word in self.stoi

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self.itos == other.itos

    __hash__ = None  # mutable lists inside: equal vocabularies must not be dict keys

    def __repr__(self) -> str:
        return f"Vocabulary(size={len(self)})"

    def encode(self, tokens: Iterable[str]) -> list[int]:
        """Ids of ``tokens`` (unknown words -> ``<unk>``); no ``<start>``/``<end>`` added."""
        return [self.stoi.get(token, UNK_ID) for token in tokens]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Words of ``ids`` up to the first ``<end>``, without ``<pad>`` and ``<start>``.

        ``ids`` may be ints or 0-d tensors/arrays; an id outside the vocabulary is an error.
        """
        words = []
        for raw_id in ids:
            index = int(raw_id)
            if index == END_ID:
                break
            if index in (PAD_ID, START_ID):
                continue
            if not 0 <= index < len(self.itos):
                raise ValueError(f"token id {index} is outside the vocabulary (size {len(self)})")
            words.append(self.itos[index])
        return words

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (plain str and list only), restored by :meth:`from_dict`."""
        return {"format": _FORMAT, "version": _VERSION, "itos": list(self.itos)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Vocabulary:
        """Inverse of :meth:`to_dict`; a malformed dict raises ValueError naming the field."""
        if not isinstance(data, Mapping):
            raise ValueError(f"vocabulary must be a dict, got {type(data).__name__}")
        if data.get("format") != _FORMAT:
            raise ValueError(
                f"vocabulary field 'format' must be {_FORMAT!r}, got {data.get('format')!r}"
            )
        if data.get("version") != _VERSION:
            raise ValueError(
                f"vocabulary field 'version' must be {_VERSION}, got {data.get('version')!r}"
            )
        itos = data.get("itos")
        if not isinstance(itos, list):
            raise ValueError(f"vocabulary field 'itos' must be a list, got {type(itos).__name__}")
        return cls(itos)
