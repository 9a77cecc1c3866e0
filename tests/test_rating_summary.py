"""Rating summary: Table 2 means, spread, agreement, and every kind of bad or odd input."""

from __future__ import annotations

import json
import math

import krippendorff
import numpy as np
import pytest

from eval.commands import rating_summary as command
from eval.rating.kit import KEY_FORMAT, RATINGS_FORMAT, write_key
from eval.rating.summary import RatingsError, bootstrap_ci, summarize

# Three images, two models; the label of each model changes from image to image.
KEY = {
    "format": KEY_FORMAT, "kit_id": "kit123", "seed": 0, "vmax": 1.0,
    "models": [{"name": "softmax", "checkpoint": "s.ckpt", "mapping": "softmax"},
               {"name": "tvmax", "checkpoint": "t.ckpt", "mapping": "tvmax"}],
    "images": [{"key": "1", "name": "1.jpg", "labels": {"A": "softmax", "B": "tvmax"}},
               {"key": "2", "name": "2.jpg", "labels": {"A": "tvmax", "B": "softmax"}},
               {"key": "3", "name": "3.jpg", "labels": {"A": "softmax", "B": "tvmax"}}],
}
# (image, label) -> (caption, attention) per rater.
RATER_1 = {("1", "A"): (3, 2), ("1", "B"): (4, 5), ("2", "A"): (5, 4), ("2", "B"): (2, 3),
           ("3", "A"): (3, 3), ("3", "B"): (5, 5)}
RATER_2 = {("1", "A"): (2, 2), ("1", "B"): (4, 4), ("2", "A"): (4, 5), ("2", "B"): (3, 3),
           ("3", "A"): (3, 2), ("3", "B"): (5, 4)}


def _ratings(rater: str, scores: dict, kit_id: str = "kit123", time: str = "2026-01-01") -> dict:
    return {"format": RATINGS_FORMAT, "kit_id": kit_id, "rater_id": rater,
            "exported_at": time, "ratings": [
                {"image": image, "label": label, "caption_score": c, "attention_score": a,
                 "caption_time": time, "attention_time": time}
                for (image, label), (c, a) in scores.items()]}


def _write(path, data):
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def key_path(tmp_path):
    path = tmp_path / "key.json"
    write_key(KEY, path)
    return path


def test_means_std_counts_and_agreement(tmp_path, key_path):
    files = [_write(tmp_path / "r1.json", _ratings("r1", RATER_1)),
             _write(tmp_path / "r2.json", _ratings("r2", RATER_2))]
    summary = summarize(files, key_path)
    # softmax: image 1 label A, image 2 label B, image 3 label A.
    softmax_caption = [3, 2, 2, 3, 3, 3]  # r1 then r2, by image
    tvmax_attention = [5, 4, 4, 5, 5, 4]
    s = summary["models"]["softmax"]["caption"]
    assert s["mean"] == pytest.approx(np.mean(softmax_caption))
    assert s["std"] == pytest.approx(np.std(softmax_caption, ddof=1))
    assert (s["n"], s["raters"], s["images"]) == (6, 2, 3)
    assert summary["models"]["tvmax"]["attention"]["mean"] == pytest.approx(
        np.mean(tvmax_attention))
    low, high = s["ci95"]
    assert low <= s["mean"] <= high and 2 <= low and high <= 3
    assert summary["raters"] == ["r1", "r2"] and summary["images_rated"] == 3
    # Units (image, model) in key order: (1, softmax), (1, tvmax), (2, softmax), ...
    caption_matrix = [[3, 4, 2, 5, 3, 5], [2, 4, 3, 4, 3, 5]]
    expected = krippendorff.alpha(reliability_data=caption_matrix, value_domain=[1, 2, 3, 4, 5],
                                  level_of_measurement="ordinal")
    assert summary["agreement"]["caption"]["krippendorff_alpha_ordinal"] == \
        pytest.approx(expected)
    assert summary["incomplete"] == summary["missing"] == summary["duplicates"] == []


def test_the_latest_of_duplicate_ratings_is_chosen_by_time_not_by_its_text(tmp_path, key_path):
    """23:30 UTC is later than 00:00 at UTC+1 (23:00 UTC), though its text sorts first; a
    text that is no time at all was kept as "latest" when the texts were compared."""
    files = [_write(tmp_path / "r1.json", _ratings("r1", RATER_1,
                                                   time="2026-02-01T00:00:00+01:00")),
             _write(tmp_path / "r1-later.json", _ratings("r1", {("1", "A"): (1, 1)},
                                                         time="2026-01-31T23:30:00.000Z"))]
    [duplicate] = summarize(files, key_path)["duplicates"]
    assert duplicate["kept_time"] == "2026-01-31T23:30:00.000Z"
    assert duplicate["scores"] == [[3, 2], [1, 1]]
    files.append(_write(tmp_path / "r1-edited.json", _ratings("r1", RATER_1, time="yesterday")))
    with pytest.raises(RatingsError, match=r"r1-edited.json: rating 0: caption_time must be an "
                                           r"ISO 8601 time string, got 'yesterday'"):
        summarize(files, key_path)
    no_kit = _ratings("r1", RATER_1)
    del no_kit["kit_id"]
    with pytest.raises(RatingsError, match=r"no-kit.json: field 'kit_id' is missing"):
        summarize([_write(tmp_path / "no-kit.json", no_kit)], key_path)


def test_incomplete_missing_and_duplicate_ratings_are_reported(tmp_path, key_path):
    partial = dict(RATER_2)
    partial["2", "A"] = (4, None)
    del partial["3", "B"]
    newer = _ratings("r1", {("1", "A"): (5, 5)}, time="2026-02-01")
    files = [_write(tmp_path / "r1.json", _ratings("r1", RATER_1)),
             _write(tmp_path / "r1-again.json", newer),
             _write(tmp_path / "r2.json", _ratings("r2", partial))]
    summary = summarize(files, key_path)
    assert summary["incomplete"] == [{"rater": "r2", "image": "2", "label": "A",
                                      "file": str(files[2]), "missing": ["attention"]}]
    assert summary["missing"] == [{"rater": "r2", "image": "3", "label": "B"}]
    [duplicate] = summary["duplicates"]
    assert (duplicate["rater"], duplicate["image"], duplicate["count"]) == ("r1", "1", 2)
    assert duplicate["kept_time"] == "2026-02-01"
    assert summary["rater_files"] == {"r1": [str(files[0]), str(files[1])]}
    # The newer duplicate (5, 5) counts for softmax on image 1; r2's missing score does not.
    assert summary["models"]["softmax"]["caption"]["mean"] == \
        pytest.approx(np.mean([5, 2, 3, 2, 3, 3]))
    tvmax = summary["models"]["tvmax"]
    assert tvmax["attention"]["n"] == 4 and tvmax["caption"]["n"] == 5
    assert tvmax["attention"]["mean"] == pytest.approx(np.mean([5, 4, 4, 5]))


def test_single_rater_has_no_agreement_figure(tmp_path, key_path):
    summary = summarize([_write(tmp_path / "r1.json", _ratings("r1", RATER_1))], key_path)
    assert summary["agreement"]["caption"] == {"krippendorff_alpha_ordinal": None,
                                               "note": "needs at least 2 raters"}


def test_ratings_all_of_one_value_have_no_agreement_figure(tmp_path, key_path, recwarn):
    # Alpha is 1 - 0/0 there: the krippendorff package returns NaN with a RuntimeWarning,
    # which the table showed as 'nan' with no reason.
    same = {cell: (3, 4) for cell in RATER_1}
    files = [_write(tmp_path / f"{rater}.json", _ratings(rater, same)) for rater in ("r1", "r2")]
    summary = summarize(files, key_path)
    for aspect in ("caption", "attention"):
        assert summary["agreement"][aspect] == {"krippendorff_alpha_ordinal": None,
                                               "note": "every rating has the same value"}
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.update(kit_id="other"), "kit 'other' do not match the key of kit 'kit123'"),
        (lambda d: d["ratings"][0].update(image="99"), "image '99' is not in the key"),
        (lambda d: d["ratings"][1].update(label="Z"), "label 'Z' is not in the key"),
        (lambda d: d["ratings"][2].update(caption_score=6), "caption_score must be one of"),
        (lambda d: d["ratings"][2].update(attention_score=2.5), "attention_score must be one"),
        (lambda d: d.update(rater_id=" "), "rater_id is missing"),
        (lambda d: d.update(format="x"), "not a ratings file"),
        (lambda d: d["ratings"][3].pop("label"), "rating 3 lacks field 'label'"),
        (lambda d: d["ratings"][0].update(image=None), "rating 0 lacks field 'image'"),
    ],
)
def test_ratings_that_do_not_match_the_key_are_errors_naming_the_file(
    tmp_path, key_path, edit, message
):
    data = _ratings("r1", RATER_1)
    edit(data)
    bad = _write(tmp_path / "bad-ratings.json", data)
    with pytest.raises(RatingsError, match="bad-ratings.json") as error:
        summarize([bad], key_path)
    assert message in str(error.value)


def test_command_reports_errors_and_writes_summary(tmp_path, key_path, capsys):
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert command.main([str(broken), "--key", str(key_path)]) == 2
    assert "broken.json" in capsys.readouterr().err
    assert command.main([str(broken), "--key", str(broken)]) == 2

    good = _write(tmp_path / "r1.json", _ratings("r1", RATER_1))
    out = tmp_path / "summary" / "table2.json"
    assert command.main([str(good), "--key", str(key_path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "softmax" in printed and "tvmax" in printed and "Krippendorff" in printed
    assert json.loads(out.read_text())["models"]["tvmax"]["caption"]["n"] == 3


def test_command_lists_the_problems_and_refuses_a_file_given_twice(
        tmp_path, key_path, capsys):
    partial = dict(RATER_2)
    partial["2", "A"] = (4, None)
    del partial["3", "B"]
    r1 = _write(tmp_path / "r1.json", _ratings("r1", RATER_1))
    r2 = _write(tmp_path / "r2.json", _ratings("r2", partial))
    assert command.main([str(r1), str(r2), "--key", str(key_path)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[-2:] == ["incomplete: 1 (rater r2, image 2, label A: no attention)",
                            "missing: 1 (rater r2, image 3, label B)"]
    out = tmp_path / "table2.json"
    assert command.main([str(r1), str(r2), "--key", str(key_path), "--out", str(out)]) == 0
    # Listed with --out too (it printed the counts alone).
    listed = capsys.readouterr().out.splitlines()
    assert all(line in listed for line in printed[-2:])
    # One rater's file twice (here by a link) would count each rating as a duplicate.
    again = tmp_path / "link.json"
    again.symlink_to(r1)
    assert command.main([str(r1), str(again), "--key", str(key_path)]) == 2
    assert capsys.readouterr().err == (
        f"captioner rating-summary: ratings file {again} is given twice (also as {r1}); give "
        "each ratings file once\n")


def test_two_files_of_one_rater_id_are_named_as_one_rater(tmp_path, key_path, capsys):
    # Raters type their id: a second rater who also typed "r1" is merged into the first.
    first = _write(tmp_path / "anna.json", _ratings("r1", RATER_1))
    second = _write(tmp_path / "ben.json", _ratings("r1 ", RATER_2, time="2026-01-02"))
    assert command.main([str(first), str(second), "--key", str(key_path)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert f"rater r1: 2 files ({first}, {second}) give this rater id, counted as one rater " \
        "(of a caption rated in several, the later rating): give different raters different " \
        "ids" in printed
    assert "raters: 1, images rated: 3 of 3" in printed
    alone = _write(tmp_path / "r2.json", _ratings("r2", RATER_2))
    assert command.main([str(first), str(alone), "--key", str(key_path)]) == 0
    assert not any(line.startswith("rater ") for line in capsys.readouterr().out.splitlines())


def test_a_rater_id_cannot_send_control_characters_to_the_terminal(tmp_path, key_path,
                                                                   capsys):
    partial = dict(RATER_2)
    del partial["3", "B"]
    r1 = _write(tmp_path / "r1.json", _ratings("r1", RATER_1))
    # An escape sequence, a line separator, a right-to-left override, and a backslash that
    # would read as an escape written by us.
    r2 = _write(tmp_path / "r2.json",
                _ratings("r\x1b[2J\x1b[31mED\u2028x\u202ey\\x1b", partial))
    assert command.main([str(r1), str(r2), "--key", str(key_path)]) == 0
    printed = capsys.readouterr().out
    assert not {"\x1b", "\u2028", "\u202e"} & set(printed)
    assert printed.splitlines()[-1] == (
        "missing: 1 (rater r\\x1b[2J\\x1b[31mED\\u2028x\\u202ey\\\\x1b, image 3, label B)")


def test_bootstrap_interval():
    same = [np.array([4.0, 4.0]), np.array([4.0])]
    assert bootstrap_ci(same) == (4.0, 4.0)
    assert all(math.isnan(v) for v in bootstrap_ci([np.array([1.0, 5.0])]))
    spread = [np.array([1.0]), np.array([5.0]), np.array([3.0]), np.array([2.0])]
    low, high = bootstrap_ci(spread)
    assert 1.0 <= low < 2.75 < high <= 5.0


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda k: k["images"][0]["labels"].update(A="nomodel"),
         "images[0] labels a model 'nomodel' that is not among its models (softmax, tvmax)"),
        (lambda k: k["images"][0].update(labels=["softmax", "tvmax"]),
         "images[0] must be an object with a 'key' and 'labels' (label -> model name)"),
        (lambda k: k.update(models="x"), "field 'models' must be a list of objects with a 'name'"),
        (lambda k: k.update(images={}), "field 'images' must be a list"),
        (lambda k: k.pop("kit_id"), "field 'kit_id' must be a string"),
    ],
    ids=["unknown model", "labels a list", "models a string", "images an object", "no kit_id"],
)
def test_a_malformed_key_is_named_with_its_field(tmp_path, edit, message):
    key = json.loads(json.dumps(KEY))
    edit(key)
    bad = _write(tmp_path / "bad-key.json", key)
    good = _write(tmp_path / "r1.json", _ratings("r1", RATER_1))
    with pytest.raises(RatingsError) as error:
        summarize([good], bad)
    assert str(error.value) == f"{bad}: {message}"
