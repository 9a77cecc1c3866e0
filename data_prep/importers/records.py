"""What an import reads and reports: caption records, their checks shared by the formats,
and the problems found, each under a reason of :data:`REASONS` with its place in the file."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from data_prep.karpathy import normalize_image_path
from data_prep.wording import first_names

ON_ERROR: tuple[str, ...] = ("skip", "fail")


# Reason -> how it is named in messages, in the order the checks run.
REASONS: dict[str, str] = {
    "malformed_record": "malformed record",
    "invalid_path": "invalid image path",
    "duplicate_entry": "duplicate entry",
    "empty_caption": "empty caption",
    "duplicate_caption": "duplicate caption",
    "no_captions": "image without captions",
    "missing_image": "missing image",
    "unreadable_image": "unreadable image",
    "not_in_split_file": "image not in the split file",
    "unknown_in_split_file": "split-file name without captions",
}


class DatasetImportError(ValueError):
    """A problem that stops the import; the message names the file, line or field and value."""


@dataclass(frozen=True)
class Caption:
    """One caption as read: ``where`` names its place (``captions.csv line 9``,
    ``captions.jsonl line 3 caption 2``, ``captions.json annotations[4]``) and ``order`` its
    position in the file (the line; for COCO, images then annotations counted through), by
    which problems are sorted."""

    text: str
    where: str
    order: int


@dataclass
class CaptionRecord:
    """One image of a captions file: ``image`` is its normalized relative path, ``where`` and
    ``order`` the place it was read from (as for :class:`Caption`), ``cocoid`` its COCO id if
    known."""

    image: str
    captions: list[Caption]
    where: str
    order: int
    cocoid: int | None = None


@dataclass(frozen=True)
class Problem:
    """One reported problem: ``reason`` (a key of :data:`REASONS`), ``item`` (the image path
    or record it concerns), a one-line ``detail`` naming the file and line, ``where`` its place
    (``captions.csv line 8``), ``order`` its position in the captions file (``inf`` for
    problems outside it), so that problems can be listed in file order, and ``skipping``, what
    skipping it leaves out, where that is not the whole item (``the later entry``)."""

    reason: str
    item: str
    detail: str
    where: str
    order: float
    skipping: str = ""

    @property
    def skipped(self) -> str:
        """The detail with what skipping the problem leaves out: as skipped by default (with
        ``--on-error fail`` nothing is skipped, and the detail alone names the problem)."""
        return f"{self.detail}; {self.skipping}" if self.skipping else self.detail


class ProblemLog:
    """Collects problems; with ``on_error="fail"``, :meth:`stop_if_failing` raises for them.

    The captions file is checked in stages (records, paths, captions), each finding its own
    kind of problem; they are all collected before the first stop, so that the error names the
    first problem in file order rather than the first found by an earlier stage.
    """

    def __init__(self, on_error: str) -> None:
        if on_error not in ON_ERROR:
            raise DatasetImportError(f"on_error must be one of {', '.join(ON_ERROR)}")
        self.on_error = on_error
        self.problems: list[Problem] = []

    def add(self, reason: str, item: str, detail: str, *, where: str, order: float,
            skipping: str = "") -> None:
        self.problems.append(Problem(reason, item, detail, where, order, skipping))

    def stop_if_failing(self) -> None:
        """With ``on_error="fail"`` and a problem found, raise :class:`DatasetImportError`
        naming the first problem in file order, then the places of the others."""
        if self.on_error != "fail" or not self.problems:
            return
        first, *rest = sorted(self.problems, key=lambda problem: problem.order)
        others = first_names([f"{REASONS[p.reason]} at {p.where}" for p in rest])
        more = f" (and {len(rest)} more: {others})" if rest else ""
        raise DatasetImportError(f"{REASONS[first.reason]}: {first.detail}{more}")

    def by_reason(self) -> dict[str, list[Problem]]:
        """The problems grouped by reason, reasons in :data:`REASONS` order, each group in
        file order."""
        groups: dict[str, list[Problem]] = {}
        for reason in REASONS:
            found = [p for p in self.problems if p.reason == reason]
            if found:
                groups[reason] = sorted(found, key=lambda problem: problem.order)
        return groups


def add_json_record(records: list[CaptionRecord], record: object, where: str, place: str,
                order: int, log: ProblemLog) -> None:
    """Append JSON record ``record`` (``{"image": str, "captions": [str, ...]}``) read at
    ``where`` (short) / ``place`` (with the file's path) to ``records``, or report why not."""
    image = record.get("image") if isinstance(record, dict) else None
    captions = record.get("captions") if isinstance(record, dict) else None
    if not isinstance(record, dict):
        problem = f"must be a JSON object, got {type(record).__name__}"
    elif absent := [field for field in ("image", "captions") if field not in record]:
        problem = (f"field {absent[0]!r} is missing (a record holds 'image' and "
                   f"'captions'; it has {', '.join(map(repr, record)) or 'no field'})")
    elif not isinstance(image, str):
        problem = f"field 'image' must be a string, got {image!r}"
    elif not isinstance(captions, list) or not all(isinstance(c, str) for c in captions):
        problem = f"field 'captions' must be a list of strings, got {captions!r}"
    else:
        records.append(CaptionRecord(image, [
            Caption(text, f"{where} caption {k}", order)
            for k, text in enumerate(captions, start=1)
        ], where, order))
        return
    log.add("malformed_record", where, f"{place}: {problem}", where=where, order=order)


def gathered(records: Iterable[CaptionRecord], log: ProblemLog, *, merge: bool
            ) -> list[CaptionRecord]:
    """Normalize the paths; with ``merge``, join the captions of records of the same image,
    else report every later record of an image as a duplicate entry."""
    kept: dict[str, CaptionRecord] = {}
    for record in records:
        image = normalize_image_path(record.image)
        if image is None:
            log.add("invalid_path", record.where, f"{record.where}: image path {record.image!r} "
                    "must be a non-empty path relative to the image folder, without '..'",
                    where=record.where, order=record.order)
        elif image not in kept:
            record.image = image
            kept[image] = record
        elif merge:
            kept[image].captions.extend(record.captions)
        else:
            log.add("duplicate_entry", image, f"{image}: listed again at {record.where} (first "
                    f"at {kept[image].where})", where=record.where, order=record.order,
                    skipping="the later entry is skipped")
    return list(kept.values())


def skipped_summary(log: ProblemLog) -> str:
    """What was skipped, by reason, with an example each: the likely cause of too few images
    (a wrong --images folder: every image missing), for a message after which no report comes."""
    return "; ".join(f"{len(found)} skipped as {REASONS[reason]}, e.g. {found[0].skipped}"
                     for reason, found in log.by_reason().items())
