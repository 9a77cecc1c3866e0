"""Summary of a human rating study: the paper's Table 2 with its uncertainty.

Martins et al. (Table 2, appendix B) report, per attention mapping, the mean caption score and
the mean attention-relevance score (both 1-5) over 100 images x 6 raters. `summarize` computes
those means from the ratings files exported by the kit (`eval.rating.kit`), after unblinding
them with the kit's key, and adds per model and score kind:

* ``n`` (ratings), ``raters`` and ``images`` counted;
* ``std``: sample standard deviation of the individual ratings (ddof = 1);
* ``ci95``: percentile-bootstrap 95% interval of the mean, resampling *images* (the sampled
  unit; ratings of one image by several raters are not independent), `BOOTSTRAP_SAMPLES`
  resamples with a fixed seed;
* ``agreement``: Krippendorff's alpha, ordinal, over units = (image, model), per score kind.

Nothing is dropped silently: a rating with a missing score is listed under ``incomplete``
(its other score still counts), a (rater, image, label) rated more than once is listed under
``duplicates`` and only its most recently scored entry counts, and an (image, label) of the key
that a rater's files do not mention at all is listed under ``missing`` (every one, for a rater
whose file holds no ratings). Files of one rater id count as one rater's, and are named under
``rater_files`` (two raters who typed the same id would otherwise pass unseen). A ratings
file that is not valid JSON, has another kit id, names an image or label not in the key, or
holds a field of the wrong type (edited by hand, say) raises `RatingsError` naming the file,
the rating and the field.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from data_prep.settings_files import parse_json
from data_prep.text import printable
from data_prep.wording import first_names
from eval.rating.kit import KEY_FORMAT, RATINGS_FORMAT, SCORES

KINDS = ("caption", "attention")
BOOTSTRAP_SAMPLES = 10_000
BOOTSTRAP_SEED = 0


class RatingsError(ValueError):
    """A ratings or key file that cannot be used; the message names the file."""


@dataclass(frozen=True)
class Rating:
    """One exported entry: scores are ints in `SCORES` or None (not given); ``last_time`` is
    the later of its two times as written (``""`` when it has none)."""

    file: str
    rater: str
    image: str
    label: str
    model: str
    caption_score: int | None
    attention_score: int | None
    last_time: str

    def score(self, kind: str) -> int | None:
        return self.caption_score if kind == "caption" else self.attention_score


def _read_json(path: Path, what: str) -> dict:
    try:
        data = parse_json(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RatingsError(f"{path}: cannot read the {what} file: {exc}") from exc
    if not isinstance(data, dict):
        raise RatingsError(f"{path}: the {what} file must hold a JSON object")
    return data


@dataclass(frozen=True)
class RatingKey:
    """The unblinding key: ``labels[image][label]`` is the model shown under that label."""

    kit_id: str
    models: list[str]
    labels: dict[str, dict[str, str]]


def load_key(path: Path) -> RatingKey:
    """Read and check a key written by `eval.rating.kit.write_key`."""
    data = _read_json(path, "key")
    if data.get("format") != KEY_FORMAT:
        raise RatingsError(f"{path}: not a rating-kit key (format {data.get('format')!r}, "
                           f"expected {KEY_FORMAT!r})")
    models, images = data.get("models"), data.get("images")
    if not isinstance(data.get("kit_id"), str):
        raise RatingsError(f"{path}: field 'kit_id' must be a string")
    if not isinstance(models, list) or not all(
            isinstance(m, dict) and isinstance(m.get("name"), str) for m in models):
        raise RatingsError(f"{path}: field 'models' must be a list of objects with a 'name'")
    if not isinstance(images, list):
        raise RatingsError(f"{path}: field 'images' must be a list")
    names = [m["name"] for m in models]
    labels = {}
    for index, item in enumerate(images):
        if not (isinstance(item, dict) and isinstance(item.get("key"), str)
                and isinstance(item.get("labels"), dict)):
            raise RatingsError(f"{path}: images[{index}] must be an object with a 'key' and "
                               "'labels' (label -> model name)")
        unknown = [m for m in item["labels"].values() if m not in names]
        if unknown:
            raise RatingsError(f"{path}: images[{index}] labels a model {unknown[0]!r} that is "
                               f"not among its models ({first_names(names)})")
        labels[item["key"]] = dict(item["labels"])
    return RatingKey(kit_id=data["kit_id"], models=names, labels=labels)


def _score(value: object, path: Path, index: int, field: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value not in SCORES:
        raise RatingsError(f"{path}: rating {index}: {field} must be one of {list(SCORES)} or "
                           f"null, got {value!r}")
    return value


def _text(value: object, path: Path, index: int, field: str, what: str) -> str | None:
    """``value`` of a rating's string ``field`` (``what`` it holds), None when null; the page
    writes strings, so anything else was edited in by hand."""
    if value is None or isinstance(value, str):
        return value
    raise RatingsError(f"{path}: rating {index}: {field} must be {what}, got {value!r}")


def _as_time(text: str) -> datetime:
    """An ISO 8601 time as an aware datetime (the page writes UTC, ``...Z``; one without a
    zone is taken as UTC), so that times are compared as times, never as strings."""
    time = datetime.fromisoformat(text)
    return time if time.tzinfo is not None else time.replace(tzinfo=UTC)


def _time(value: str, path: Path, index: int, field: str) -> datetime:
    """A rating's time ``field``, checked."""
    try:
        return _as_time(value)
    except ValueError:
        raise RatingsError(f"{path}: rating {index}: {field} must be an ISO 8601 time string, "
                           f"got {value!r}") from None


def load_ratings(path: Path, key: RatingKey) -> tuple[str, list[Rating]]:
    """Read one exported ratings file and unblind it with ``key`` (from `load_key`): its rater
    id (stripped) and its ratings, in file order."""
    data = _read_json(path, "ratings")
    if data.get("format") != RATINGS_FORMAT:
        raise RatingsError(f"{path}: not a ratings file (format {data.get('format')!r}, "
                           f"expected {RATINGS_FORMAT!r})")
    if "kit_id" not in data:
        raise RatingsError(f"{path}: field 'kit_id' is missing (the page writes the id of its "
                           "kit)")
    if data.get("kit_id") != key.kit_id:
        raise RatingsError(f"{path}: ratings of kit {data.get('kit_id')!r} do not match the "
                           f"key of kit {key.kit_id!r}")
    rater = data.get("rater_id")
    if not isinstance(rater, str) or not rater.strip():
        raise RatingsError(f"{path}: rater_id is missing or empty")
    entries = data.get("ratings")
    if not isinstance(entries, list):
        raise RatingsError(f"{path}: field 'ratings' must be a list")
    ratings = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise RatingsError(f"{path}: rating {index} is not an object")
        image = _text(entry.get("image"), path, index, "image", "a string, the kit's image key")
        label = _text(entry.get("label"), path, index, "label", "a string, a caption's letter")
        lacking = [field for field in ("image", "label") if entry.get(field) is None]
        if lacking:
            raise RatingsError(f"{path}: rating {index} lacks field {lacking[0]!r}")
        labels = key.labels.get(image)
        if labels is None:
            raise RatingsError(f"{path}: rating {index}: image {image!r} is not in the key")
        if label not in labels:
            raise RatingsError(f"{path}: rating {index}: label {label!r} is not in the key "
                               f"for image {image!r}")
        times = [(_time(text, path, index, field), text)
                 for field in ("caption_time", "attention_time")
                 if (text := _text(entry.get(field), path, index, field,
                                   "an ISO 8601 time string"))]
        ratings.append(Rating(
            str(path), rater.strip(), image, label, labels[label],
            _score(entry.get("caption_score"), path, index, "caption_score"),
            _score(entry.get("attention_score"), path, index, "attention_score"),
            max(times)[1] if times else "",
        ))
    return rater.strip(), ratings


def bootstrap_ci(values_by_image: Sequence[np.ndarray], samples: int = BOOTSTRAP_SAMPLES,
                 seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """95% percentile interval of the mean rating, resampling images with replacement.

    values_by_image: one float array of ratings per image. The statistic of a resample is the
    mean of all ratings it contains (the paper's mean), computed from per-image sums/counts.
    """
    sums = np.array([v.sum() for v in values_by_image], dtype=np.float64)
    counts = np.array([v.size for v in values_by_image], dtype=np.float64)
    if len(sums) < 2:
        return math.nan, math.nan
    picks = np.random.default_rng(seed).integers(0, len(sums), size=(samples, len(sums)))
    means = sums[picks].sum(axis=1) / counts[picks].sum(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(low), float(high)


def krippendorff_alpha(matrix: np.ndarray) -> tuple[float | None, str | None]:
    """Ordinal Krippendorff's alpha of a (raters, units) matrix with NaN = not rated."""
    import krippendorff

    if matrix.shape[0] < 2:
        return None, "needs at least 2 raters"
    pairable = np.sum(~np.isnan(matrix), axis=0) >= 2
    if not pairable.any():
        return None, "no unit was rated by 2 or more raters"
    values = matrix[:, pairable]
    if np.unique(values[~np.isnan(values)]).size < 2:
        # No disagreement is expected by chance either: alpha = 1 - 0/0 (the package returns
        # NaN with a RuntimeWarning).
        return None, "every rating has the same value"
    try:
        return float(krippendorff.alpha(reliability_data=matrix, value_domain=list(SCORES),
                                        level_of_measurement="ordinal")), None
    except ValueError as exc:
        return None, str(exc)


def _latest(rating: Rating) -> datetime:
    """Orders ratings by their last time; one without a time is the oldest."""
    return _as_time(rating.last_time) if rating.last_time else datetime.min.replace(tzinfo=UTC)


def _deduplicate(ratings: list[Rating]) -> tuple[list[Rating], list[dict]]:
    groups: dict[tuple[str, str, str], list[Rating]] = defaultdict(list)
    for rating in ratings:
        groups[rating.rater, rating.image, rating.label].append(rating)
    kept, duplicates = [], []
    for (rater, image, label), group in groups.items():
        latest = max(group, key=_latest)
        kept.append(latest)
        if len(group) > 1:
            duplicates.append({
                "rater": rater, "image": image, "label": label, "count": len(group),
                "files": sorted({r.file for r in group}), "kept_time": latest.last_time,
                "scores": [[r.caption_score, r.attention_score] for r in group],
            })
    return kept, duplicates


def summarize(ratings_paths: Sequence[Path], key_path: Path) -> dict:
    """Table 2 per model from the kit's exported ratings; see the module docstring."""
    if not ratings_paths:
        raise RatingsError("no ratings files given")
    key = load_key(key_path)
    files = [load_ratings(Path(path), key) for path in ratings_paths]
    ratings, duplicates = _deduplicate([r for _, loaded in files for r in loaded])
    # From the files, not the ratings: a rater who exported before scoring anything is missing
    # every rating, not absent from the study.
    raters = sorted({rater for rater, _ in files})
    # Raters type their id into the page: two people who chose the same one, or one who
    # exported twice, give one rater of several files, whose overlapping ratings merge.
    rater_files = {rater: [str(path) for path, (other, _) in zip(ratings_paths, files,
                                                                 strict=True) if other == rater]
                   for rater in raters}
    incomplete = [
        {"rater": r.rater, "image": r.image, "label": r.label, "file": r.file,
         "missing": [k for k in KINDS if r.score(k) is None]}
        for r in ratings if r.caption_score is None or r.attention_score is None
    ]
    seen = {(r.rater, r.image, r.label) for r in ratings}
    missing = [
        {"rater": rater, "image": image, "label": label}
        for rater in raters for image, labels in key.labels.items() for label in labels
        if (rater, image, label) not in seen
    ]
    units = [(image, model) for image, labels in key.labels.items()
             for model in sorted(set(labels.values()))]
    unit_index = {unit: i for i, unit in enumerate(units)}
    rater_index = {rater: i for i, rater in enumerate(raters)}

    models, agreement = {}, {}
    for kind in KINDS:
        scored = [r for r in ratings if r.score(kind) is not None]
        matrix = np.full((len(raters), len(units)), np.nan)
        for r in scored:
            matrix[rater_index[r.rater], unit_index[r.image, r.model]] = r.score(kind)
        alpha, reason = krippendorff_alpha(matrix)
        agreement[kind] = {"krippendorff_alpha_ordinal": alpha, "note": reason}
        for model in key.models:
            mine = [r for r in scored if r.model == model]
            by_image: dict[str, list[int]] = defaultdict(list)
            for r in mine:
                by_image[r.image].append(r.score(kind))
            values = np.array([r.score(kind) for r in mine], dtype=np.float64)
            models.setdefault(model, {})[kind] = {
                "mean": float(values.mean()) if values.size else None,
                "std": float(values.std(ddof=1)) if values.size > 1 else None,
                "ci95": list(bootstrap_ci([np.array(v, float) for v in by_image.values()]))
                if by_image else None,
                "n": int(values.size),
                "raters": len({r.rater for r in mine}),
                "images": len(by_image),
            }
    return {
        "kit_id": key.kit_id,
        "files": [str(p) for p in ratings_paths],
        "raters": raters,
        "rater_files": {rater: paths for rater, paths in rater_files.items() if len(paths) > 1},
        "images_in_key": len(key.labels),
        "images_rated": len({r.image for r in ratings
                             if r.caption_score is not None or r.attention_score is not None}),
        "models": models,
        "agreement": agreement,
        "ci_method": f"percentile bootstrap over images, {BOOTSTRAP_SAMPLES} resamples, "
                     f"seed {BOOTSTRAP_SEED}",
        "incomplete": incomplete,
        "missing": missing,
        "duplicates": duplicates,
    }


def format_table(summary: dict, written_to: Path | None = None) -> str:
    """The summary as a plain-text Table 2 with the problems underneath: counted, and listed
    in the JSON file ``written_to`` or, without one, here (the first ten of each kind)."""
    width = max([16, *map(len, summary["models"])])
    lines = [f"{'model':<{width}} {'caption (1-5)':<28} {'attention relevance (1-5)':<28} "
             "raters images"]
    for model, kinds in summary["models"].items():
        cells = []
        for kind in KINDS:
            s = kinds[kind]
            if s["mean"] is None:
                cells.append(f"{'-':<28}")
                continue
            std = f"{s['std']:.2f}" if s["std"] is not None else "-"
            low, high = s["ci95"] or (math.nan, math.nan)
            cells.append(f"{s['mean']:.2f} ±{std} [{low:.2f}, {high:.2f}]".ljust(28))
        counts = max(kinds[k]["raters"] for k in KINDS), max(kinds[k]["images"] for k in KINDS)
        lines.append(f"{model:<{width}} {cells[0]} {cells[1]} {counts[0]:>6} {counts[1]:>6}")
    lines.append("mean ±std [95% CI: " + summary["ci_method"] + "]")
    for kind in KINDS:
        alpha = summary["agreement"][kind]["krippendorff_alpha_ordinal"]
        note = summary["agreement"][kind]["note"]
        value = f"{alpha:.3f}" if alpha is not None else f"n/a ({note})"
        lines.append(f"Krippendorff's alpha (ordinal), {kind}: {value}")
    lines.append(f"raters: {len(summary['raters'])}, images rated: {summary['images_rated']} "
                 f"of {summary['images_in_key']}")
    for rater, paths in summary["rater_files"].items():
        named = ", ".join(map(printable, paths))
        lines.append(f"rater {printable(rater)}: {len(paths)} files ({named}) give this rater id"
                     ", counted as one rater (of a caption rated in several, the "
                     "later rating): give different raters different ids")
    for name in ("incomplete", "missing", "duplicates"):
        if not summary[name]:
            continue
        listed = [_problem(entry) for entry in summary[name]]
        rest = f"all in {written_to}" if written_to is not None else "--out FILE lists all"
        lines.append(f"{name}: {len(listed)} ({first_names(listed, separator='; ')}"
                     f"{'; ' + rest if len(listed) > 10 else ''})")
    return "\n".join(lines)


def _problem(entry: dict) -> str:
    """One incomplete, missing or duplicate rating of the summary, in a few words."""
    words = (f"rater {printable(entry['rater'])}, image {printable(str(entry['image']))}, "
             f"label {printable(entry['label'])}")
    if "missing" in entry:
        words += f": no {' or '.join(entry['missing'])}"
    if "count" in entry:
        words += f": rated {entry['count']} times"
    return words


def summarize_rating_files(
    ratings: Sequence[Path],
    key: Path,
    out: Path | None = None,
    overwrite: bool = False,
) -> int:
    """Unblind the ratings exported by a rating kit with its key and print, per model, mean
    caption score and mean attention relevance (paper Table 2); the exit status: 0, or 2 for a
    user error (one line).

    Args:
        ratings: ratings files exported from the kit page, one per rater.
        key: the kit's key file.
        out: write the full summary as JSON here.
        overwrite: replace an existing --out file (default: refuse it).
    """
    from captioner.reporting import report_error
    from data_prep.atomic import write_json
    from data_prep.paths import check_output_file, refuse_repeated, require_file

    prog = "captioner rating-summary"
    ratings, key = [Path(path) for path in ratings], Path(key)
    try:
        if out is not None:
            check_output_file(out, [("key file", key),
                                    *(("ratings file", path) for path in ratings)],
                              overwrite=overwrite)
        for path in (*ratings, key):
            require_file(path, "ratings file" if path != key else "key file")
        refuse_repeated(ratings, "ratings file")  # its ratings would count as duplicates
        summary = summarize(ratings, key)
    except (RatingsError, OSError, ValueError) as exc:
        return report_error(prog, exc)
    print(format_table(summary, out))
    if out is not None:
        try:
            write_json(out, summary)
        except OSError as exc:
            return report_error(prog, exc, f"cannot write {out}")
        print(f"summary written to {out}")
    return 0
