"""Human-like reference captions for the synthetic shape scenes of :mod:`data_prep.synthetic`.

Each scene gets five different captions built from several templates per number of objects,
with synonyms for sizes and some shapes, optional locations ("in the top left corner") and
pairwise relations ("to the left of", "above", "next to"). Colour words never vary and every
caption names every object's colour and shape, so the words stay learnable and every shape word
a model generates points to exactly one object mask (colours and shapes are distinct within a
scene).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from data_prep.karpathy import tokenize

# Words a caption may use for each shape category (the evaluation's synonym list).
CATEGORY_WORDS: dict[str, tuple[str, ...]] = {
    "circle": ("circle", "disc"),
    "square": ("square", "block"),
    "triangle": ("triangle",),
    "star": ("star",),
    "cross": ("cross",),
}
SIZE_WORDS: dict[str, tuple[str, ...]] = {
    "small": ("small", "little", "tiny"),
    "large": ("large", "big"),
}
BACKGROUND_WORDS: dict[str, tuple[str, ...]] = {
    "mottled": ("mottled", "blotchy"),
    "stripes": ("striped",),
    "gradient": ("gradient", "shaded"),
}
CAPTIONS_PER_IMAGE = 5
MAX_CAPTION_TOKENS = 18
_SIZE_PROBABILITY = 0.75  # share of noun phrases that mention the size
_COUNT_WORDS = {2: "two", 3: "three"}


@dataclass(frozen=True)
class DescribedObject:
    """What a caption can say about one object: its words and where its centre lies
    (pixels, x to the right, y down, in an image of side ``image_size``)."""

    category: str
    colour: str
    size: str
    center: tuple[float, float]
    image_size: int


def describe_scene(
    objects: Sequence[DescribedObject], background: str, rng: np.random.Generator
) -> list[str]:
    """Five distinct captions (raw strings, capitalised, ending with a period) of a scene."""
    if not 1 <= len(objects) <= 3:
        raise ValueError(f"scenes hold 1 to 3 objects, got {len(objects)}")
    templates = _TEMPLATES[len(objects)]
    captions: list[str] = []
    # Each template at most once while they last, then random ones to replace duplicates.
    schedule = [int(i) for i in rng.permutation(len(templates))]
    for attempt in range(200):
        index = schedule[attempt] if attempt < len(schedule) else int(rng.integers(len(templates)))
        template = templates[index]
        order = [objects[i] for i in rng.permutation(len(objects))]
        words = template(_Phrases(rng, background), order)
        raw = words[0].upper() + words[1:] + "."
        if raw not in captions and len(tokenize(raw)) <= MAX_CAPTION_TOKENS:
            captions.append(raw)
            if len(captions) == CAPTIONS_PER_IMAGE:
                return captions
    raise RuntimeError(f"could not write {CAPTIONS_PER_IMAGE} distinct captions for {objects}")


class _Phrases:
    """Random choices of wording for one caption."""

    def __init__(self, rng: np.random.Generator, background: str):
        self.rng = rng
        self.background = background

    def pick(self, options: Sequence[str]) -> str:
        return options[int(self.rng.integers(len(options)))]

    def thing(self, obj: DescribedObject, article: bool = True) -> str:
        words = [obj.colour, self.pick(CATEGORY_WORDS[obj.category])]
        if self.rng.random() < _SIZE_PROBABILITY:
            words.insert(0, self.pick(SIZE_WORDS[obj.size]))
        phrase = " ".join(words)
        if not article:
            return phrase
        return ("an " if phrase[0] in "aeiou" else "a ") + phrase

    def bg(self) -> str:
        return self.pick(BACKGROUND_WORDS[self.background])

    def location(self, obj: DescribedObject) -> str:
        x, y = obj.center
        column = min(2, int(3 * x / obj.image_size))
        row = min(2, int(3 * y / obj.image_size))
        vertical = ("top", None, "bottom")[row]
        horizontal = ("left", None, "right")[column]
        if vertical and horizontal:
            phrase = self.pick(
                (f"in the {vertical} {horizontal} corner", f"at the {vertical} {horizontal}")
            )
        elif vertical:
            phrase = self.pick((f"at the {vertical}", f"near the {vertical}"))
        elif horizontal:
            phrase = self.pick((f"on the {horizontal}", f"on the {horizontal} side"))
        else:
            phrase = self.pick(("in the middle", "in the center"))
        if self.rng.random() < 0.25:
            phrase += self.pick((" of the image", " of the picture"))
        return phrase

    def relation(self, a: DescribedObject, b: DescribedObject) -> str:
        """Where ``a`` is relative to ``b``."""
        dx = a.center[0] - b.center[0]
        dy = a.center[1] - b.center[1]
        if abs(dx) >= abs(dy):
            side = "left" if dx < 0 else "right"
            return self.pick((f"to the {side} of", f"to the {side} of", "next to", "beside"))
        return "above" if dy < 0 else self.pick(("below", "under"))


_Template = Callable[[_Phrases, Sequence[DescribedObject]], str]


def _one_templates() -> list[_Template]:
    return [
        lambda p, o: f"{p.thing(o[0])} {p.location(o[0])}",
        lambda p, o: f"there is {p.thing(o[0])} {p.location(o[0])}",
        lambda p, o: f"{p.thing(o[0])} on a {p.bg()} background",
        lambda p, o: f"a {p.bg()} background with {p.thing(o[0])} {p.location(o[0])}",
        lambda p, o: f"{p.pick(('a picture', 'an image'))} of {p.thing(o[0])}",
        lambda p, o: f"a single {p.thing(o[0], article=False)} {p.location(o[0])}",
        lambda p, o: f"{p.thing(o[0])} is {p.location(o[0])}",
    ]


def _two_templates() -> list[_Template]:
    return [
        lambda p, o: f"{p.thing(o[0])} {p.relation(o[0], o[1])} {p.thing(o[1])}",
        lambda p, o: f"{p.thing(o[0])} and {p.thing(o[1])}",
        lambda p, o: f"{p.thing(o[0])} {p.location(o[0])} and {p.thing(o[1])} {p.location(o[1])}",
        lambda p, o: f"two shapes, {p.thing(o[0])} and {p.thing(o[1])}",
        lambda p, o: f"there is {p.thing(o[0])} {p.relation(o[0], o[1])} {p.thing(o[1])}",
        lambda p, o: f"{p.thing(o[0])} is {p.relation(o[0], o[1])} {p.thing(o[1])}",
        lambda p, o: f"a {p.bg()} background with {p.thing(o[0])} and {p.thing(o[1])}",
    ]


def _three_templates() -> list[_Template]:
    return [
        lambda p, o: f"{p.thing(o[0])}, {p.thing(o[1])} and {p.thing(o[2])}",
        lambda p, o: (
            f"{p.thing(o[0])} {p.relation(o[0], o[1])} {p.thing(o[1])} and {p.thing(o[2])}"
        ),
        lambda p, o: f"three shapes, {p.thing(o[0])}, {p.thing(o[1])} and {p.thing(o[2])}",
        lambda p, o: (
            f"{p.thing(o[0])} {p.relation(o[0], o[1])} {p.thing(o[1])} and "
            f"{p.thing(o[2])} {p.location(o[2])}"
        ),
        lambda p, o: (
            f"{p.thing(o[0])}, {p.thing(o[1])} and {p.thing(o[2])} on a {p.bg()} background"
        ),
        lambda p, o: (
            f"{p.thing(o[0])} and {p.thing(o[1])} {p.relation(o[1], o[2])} {p.thing(o[2])}"
        ),
    ]


_TEMPLATES: dict[int, list[_Template]] = {
    1: _one_templates(),
    2: _two_templates(),
    3: _three_templates(),
}
