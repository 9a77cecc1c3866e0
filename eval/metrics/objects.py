"""Object mentions and attention precision (paper section 4, "object detection").

With COCO-format instance annotations (read with pycocotools), a caption *mentions* a
category when it contains one of the category's words (:data:`COCO_CATEGORY_WORDS` for the 80
COCO categories, ``data_prep.synthetic.CATEGORY_WORDS`` for the synthetic shapes), matched on
lower-cased whitespace tokens, singular or regular plural (+s, +es, y -> ies); multi-word
names ("teddy bear") match as consecutive tokens.

- ``object_recall``: share of (image, annotated category) pairs whose category the caption
  mentions.
- ``object_precision``: share of (image, mentioned category) pairs that are annotated in the
  image (1 - hallucination rate).
- ``attention_precision``: for every word that names an annotated category (the last word of
  a multi-word name), the share of that word's output attention mass inside the category's
  mask (union of its instances), the mask downsampled to the attention grid by area (each
  cell holds the fraction of its area covered, attention being spread evenly within a cell).
  Averaged over all such words.
- ``attention_precision_phrase``: the same over every word of the phrase that names the
  object: the category word and the attribute words right before it (the colours and sizes of
  the synthetic annotations, ``InstanceAnnotations.modifier_words``; on COCO the same words as
  ``attention_precision``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from data_prep.cell_labels import ATTRIBUTE_FIELDS, downsample_mask, load_coco, mask_orientations
from data_prep.images import orient
from data_prep.wording import first_names

# Words naming each COCO category: the category name plus common synonyms and hyponyms used in
# COCO captions. Irregular plurals are listed; regular plurals are derived.
COCO_CATEGORY_WORDS: dict[str, tuple[str, ...]] = {
    "person": (
        "person",
        "people",
        "man",
        "men",
        "woman",
        "women",
        "boy",
        "girl",
        "child",
        "children",
        "kid",
        "player",
        "guy",
        "lady",
        "ladies",
        "baby",
        "babies",
        "skier",
        "surfer",
        "skateboarder",
        "snowboarder",
        "rider",
        "adult",
        "teenager",
        "toddler",
        "pedestrian",
        "biker",
        "batter",
        "catcher",
        "pitcher",
        "umpire",
    ),
    "bicycle": ("bicycle", "bike", "cycle"),
    "car": ("car", "taxi", "sedan", "suv", "automobile", "vehicle"),
    "motorcycle": ("motorcycle", "motorbike", "motor bike", "scooter", "moped"),
    "airplane": ("airplane", "plane", "jet", "aircraft", "airliner"),
    "bus": ("bus", "buses", "busses"),
    "train": ("train", "locomotive", "tram", "subway"),
    "truck": ("truck", "pickup", "lorry"),
    "boat": ("boat", "ship", "sailboat", "canoe", "kayak", "yacht", "ferry"),
    "traffic light": ("traffic light", "stop light", "stoplight", "traffic signal"),
    "fire hydrant": ("fire hydrant", "hydrant"),
    "stop sign": ("stop sign",),
    "parking meter": ("parking meter", "meter"),
    "bench": ("bench", "benches"),
    "bird": ("bird", "pigeon", "seagull", "gull", "duck", "goose", "geese", "parrot"),
    "cat": ("cat", "kitten", "kitty"),
    "dog": ("dog", "puppy", "puppies", "pup"),
    "horse": ("horse", "pony", "ponies", "foal"),
    "sheep": ("sheep", "lamb", "ram"),
    "cow": ("cow", "cattle", "bull", "calf", "calves", "ox", "oxen"),
    "elephant": ("elephant",),
    "bear": ("bear", "grizzly"),
    "zebra": ("zebra",),
    "giraffe": ("giraffe",),
    "backpack": ("backpack", "back pack", "rucksack"),
    "umbrella": ("umbrella", "parasol"),
    "handbag": ("handbag", "purse", "bag"),
    "tie": ("tie", "necktie"),
    "suitcase": ("suitcase", "luggage", "suit case"),
    "frisbee": ("frisbee",),
    "skis": ("skis", "ski"),
    "snowboard": ("snowboard", "snow board"),
    "sports ball": ("ball", "baseball", "football", "soccer ball", "tennis ball", "basketball"),
    "kite": ("kite",),
    "baseball bat": ("baseball bat", "bat"),
    "baseball glove": ("baseball glove", "glove", "mitt"),
    "skateboard": ("skateboard", "skate board"),
    "surfboard": ("surfboard", "surf board", "board"),
    "tennis racket": ("tennis racket", "racket", "racquet"),
    "bottle": ("bottle",),
    "wine glass": ("wine glass", "wine glasses", "glass", "glasses"),
    "cup": ("cup", "mug"),
    "fork": ("fork",),
    "knife": ("knife", "knives"),
    "spoon": ("spoon",),
    "bowl": ("bowl",),
    "banana": ("banana",),
    "apple": ("apple",),
    "sandwich": ("sandwich", "burger", "sub"),
    "orange": ("orange",),
    "broccoli": ("broccoli",),
    "carrot": ("carrot",),
    "hot dog": ("hot dog", "hotdog"),
    "pizza": ("pizza",),
    "donut": ("donut", "doughnut"),
    "cake": ("cake", "cupcake"),
    "chair": ("chair", "stool"),
    "couch": ("couch", "sofa"),
    "potted plant": ("potted plant", "plant", "houseplant", "flower pot"),
    "bed": ("bed",),
    "dining table": ("dining table", "table", "desk"),
    "toilet": ("toilet",),
    "tv": ("tv", "television", "monitor", "screen"),
    "laptop": ("laptop", "computer", "notebook"),
    "mouse": ("mouse", "mice"),
    "remote": ("remote", "controller", "remote control"),
    "keyboard": ("keyboard",),
    "cell phone": ("cell phone", "phone", "cellphone", "smartphone", "mobile phone"),
    "microwave": ("microwave",),
    "oven": ("oven", "stove"),
    "toaster": ("toaster",),
    "sink": ("sink",),
    "refrigerator": ("refrigerator", "fridge"),
    "book": ("book", "novel"),
    "clock": ("clock",),
    "vase": ("vase",),
    "scissors": ("scissors",),
    "teddy bear": ("teddy bear", "teddy", "stuffed animal", "stuffed bear"),
    "hair drier": ("hair drier", "hair dryer", "hairdryer", "blow dryer"),
    "toothbrush": ("toothbrush", "tooth brush"),
}


def _inflections(word: str) -> set[str]:
    forms = {word, word + "s", word + "es"}
    if word.endswith("y") and len(word) > 1 and word[-2] not in "aeiou":
        forms.add(word[:-1] + "ies")
    return forms


def category_words_for(names: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Synonym lists for the categories ``names`` (COCO or synthetic); KeyError naming those
    without one."""
    from data_prep.synthetic import CATEGORY_WORDS

    tables = {**CATEGORY_WORDS, **COCO_CATEGORY_WORDS}
    missing = [n for n in names if n not in tables]
    if missing:
        raise KeyError(f"no synonym list for categories {first_names(missing)} (known: COCO and "
                       "synthetic)")
    return {n: tables[n] for n in names}


def mentions(
    tokens: Sequence[str], category_words: Mapping[str, Sequence[str]]
) -> dict[str, list[int]]:
    """Categories named in ``tokens`` (lower-cased words) -> positions of the naming words
    (the last word of a multi-word name). Longer names win over their parts ("teddy bear"
    is not also a "bear")."""
    phrases = sorted(
        (
            (tuple(form.split()[:-1]) + (last,), category)
            for category, words in category_words.items()
            for form in words
            for last in _inflections(form.split()[-1])
        ),
        key=lambda item: -len(item[0]),
    )
    lowered = [t.lower() for t in tokens]
    taken = [False] * len(lowered)
    found: dict[str, list[int]] = {}
    for phrase, category in phrases:
        n = len(phrase)
        for start in range(len(lowered) - n + 1):
            span = range(start, start + n)
            if tuple(lowered[start : start + n]) == phrase and not any(taken[i] for i in span):
                for i in span:
                    taken[i] = True
                found.setdefault(category, []).append(start + n - 1)
    return {category: sorted(positions) for category, positions in found.items()}


@dataclass
class InstanceAnnotations:
    """COCO instance annotations of some images: annotated categories and their masks.

    ``orientations``: image id -> ``data_prep.cell_labels.mask_orientations``, for the images
    loaded."""

    coco: object  # pycocotools.coco.COCO
    path: Path
    orientations: dict[int, int]

    @classmethod
    def load(cls, path: str | Path, images: Mapping[int, Path]) -> InstanceAnnotations:
        """The annotations of ``images`` (id -> image file) in the instances file ``path``:
        ValueError naming the files for an image it lacks or gives another size."""
        coco = load_coco(path)
        return cls(coco, Path(path), mask_orientations(coco, Path(path), images))

    @property
    def category_names(self) -> list[str]:
        return [c["name"] for c in self.coco.loadCats(self.coco.getCatIds())]

    @property
    def modifier_words(self) -> frozenset[str]:
        """The values of the annotations' attribute fields (``data_prep.cell_labels``: the
        synthetic shapes' colours and sizes; none for COCO)."""
        return frozenset(
            a[field] for a in self.coco.anns.values() for field in ATTRIBUTE_FIELDS
            if isinstance(a.get(field), str)
        )

    def has_image(self, image_id: int) -> bool:
        return image_id in self.orientations

    def categories(self, image_id: int) -> set[str]:
        anns = self.coco.loadAnns(self.coco.getAnnIds(imgIds=[image_id], iscrowd=None))
        return {self.coco.cats[a["category_id"]]["name"] for a in anns}

    def mask(self, image_id: int, category: str, grid: tuple[int, int]) -> np.ndarray:
        """Area fraction (h, w) float64 of each cell of the grid over the image as shown
        covered by ``category``."""
        cat_ids = self.coco.getCatIds(catNms=[category])
        anns = self.coco.loadAnns(self.coco.getAnnIds(imgIds=[image_id], catIds=cat_ids))
        info = self.coco.imgs[image_id]
        union = np.zeros((info["height"], info["width"]), dtype=bool)
        for ann in anns:
            union |= self.coco.annToMask(ann).astype(bool)
        return downsample_mask(orient(union, self.orientations[image_id]), grid)


def attention_precision(
    tokens: Sequence[str],
    maps: Tensor,
    image_id: int,
    annotations: InstanceAnnotations,
    category_words: Mapping[str, Sequence[str]] | None = None,
    modifiers: frozenset[str] = frozenset(),
) -> dict[int, float]:
    """Share of output attention mass inside the named object's mask, for every word of
    ``tokens`` that names a category annotated in the image, and for the ``modifiers`` words
    (colours, sizes) right before it ("a large red circle": large, red, circle): {word
    position: share}.

    ``maps``: (T, h, w) output attention, T = len(tokens). ``category_words`` defaults to the
    synonym lists of the annotation file's categories. KeyError/ValueError name the image."""
    if not annotations.has_image(image_id):
        raise KeyError(f"image {image_id} was not loaded from the instances file "
                       f"{annotations.path}")
    if maps.dim() != 3 or maps.shape[0] != len(tokens):
        raise ValueError(
            f"image {image_id}: attention of shape {tuple(maps.shape)} for {len(tokens)} tokens; "
            "expected (T, h, w) with T = number of tokens"
        )
    words = (
        category_words_for(annotations.category_names) if category_words is None else category_words
    )
    named = mentions(tokens, words)
    grid = (int(maps.shape[-2]), int(maps.shape[-1]))
    shares: dict[int, float] = {}
    for category in named.keys() & annotations.categories(image_id):
        mask = torch.from_numpy(annotations.mask(image_id, category, grid))
        positions = [p for end in named[category] for p in _phrase(tokens, end, modifiers)]
        mass = (maps[positions].to(torch.float64) * mask).sum(dim=(-2, -1))
        shares.update(zip(positions, mass.tolist(), strict=True))
    return dict(sorted(shares.items()))


def _phrase(tokens: Sequence[str], end: int, modifiers: frozenset[str]) -> range:
    """Positions of the word at ``end`` and of the ``modifiers`` words right before it."""
    start = end
    while start > 0 and tokens[start - 1].lower() in modifiers:
        start -= 1
    return range(start, end + 1)


def object_statistics(
    captions: Mapping[int, Sequence[str]],
    attention: Mapping[int, Tensor],
    annotations: InstanceAnnotations,
) -> dict[str, float]:
    """Object recall/precision and attention precision (see the module docstring) over
    ``captions[image_id]`` (token lists) with their output ``attention[image_id]`` (T, h, w),
    T = len(tokens). Images missing from the annotations raise KeyError naming the file."""
    words = category_words_for(annotations.category_names)
    modifiers = annotations.modifier_words
    annotated_total = mentioned_total = hits = 0
    inside: list[float] = []
    inside_phrase: list[float] = []
    for image_id, tokens in captions.items():
        phrase_shares = attention_precision(
            tokens, attention[image_id], image_id, annotations, words, modifiers
        )
        truth = annotations.categories(image_id)
        named = mentions(tokens, words)
        # The naming words' own shares are those of the phrases' last words (modifier words
        # are attributes, never category names).
        heads = {position for category in truth & named.keys() for position in named[category]}
        inside.extend(share for position, share in phrase_shares.items() if position in heads)
        inside_phrase.extend(phrase_shares.values())
        annotated_total += len(truth)
        mentioned_total += len(named)
        hits += len(truth & named.keys())
    nan = float("nan")
    return {
        "object_recall": hits / annotated_total if annotated_total else nan,
        "object_precision": hits / mentioned_total if mentioned_total else nan,
        "attention_precision": float(np.mean(inside)) if inside else nan,
        "attention_precision_words": float(len(inside)),
        "attention_precision_phrase": float(np.mean(inside_phrase)) if inside_phrase else nan,
        "attention_precision_phrase_words": float(len(inside_phrase)),
    }
