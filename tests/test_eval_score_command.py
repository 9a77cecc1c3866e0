"""`captioner score` input handling (no SPICE here: see test_eval_scoring.py)."""

import json
import os
import re

import pytest

from eval.commands import score

pytestmark = pytest.mark.java


def _write(path, data):
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return str(path)


@pytest.fixture
def karpathy(tmp_path):
    images = []
    for imgid, (cocoid, captions) in enumerate(
        [(5, ["A dog runs on grass.", "a brown dog running"]), (6, ["A cat on a sofa.", "cat"])]
    ):
        images.append(
            {
                "filepath": "test",
                "filename": f"{cocoid}.jpg",
                "imgid": imgid,
                "cocoid": cocoid,
                "split": "test",
                "sentences": [
                    {
                        "tokens": c.lower().strip(".").split(),
                        "raw": c,
                        "imgid": imgid,
                        "sentid": 2 * imgid + k,
                    }
                    for k, c in enumerate(captions)
                ],
            }
        )
    images.append({**images[0], "filepath": "train", "filename": "7.jpg", "cocoid": 7, "imgid": 2,
                   "split": "train"})
    return _write(tmp_path / "karpathy.json", {"dataset": "coco", "images": images})


def _score(capsys, *argv):
    rc = score.main(list(argv))
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_karpathy_references_with_split(tmp_path, karpathy, capsys):
    results = _write(
        tmp_path / "r.json",
        [{"image_id": 5, "caption": "a dog dog runs"}, {"image_id": 6, "caption": "a cat"}],
    )
    out = tmp_path / "m.json"
    rc, stdout, err = _score(
        capsys, "--results", results, "--references", karpathy, "--split", "test",
        "--metrics", "Bleu,REP", "--out", str(out),
    )  # fmt: skip
    assert rc == 0, err
    doc = json.loads(out.read_text())
    assert set(doc) == {"Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "REP", "per_image", "info"}
    # "dog dog": one consecutive repetition absent from the refs, weight 2, over the reference
    # set closest in length (4 words; no brevity penalty for a 4-word caption): 100 * 2 / 4.
    assert doc["per_image"]["5"]["REP"] == 50.0
    row = next(line for line in stdout.splitlines() if line.startswith("r "))
    assert row.split()[1] == "-"  # SPICE not requested: shown as '-', never silently dropped


def test_allow_empty_names_the_empty_captions_it_scores(tmp_path, karpathy, capsys):
    results = _write(tmp_path / "r.json",
                     [{"image_id": 5, "caption": " "}, {"image_id": 6, "caption": "a cat"}])
    rc, stdout, err = _score(capsys, "--results", results, "--references", karpathy, "--split",
                             "test", "--metrics", "REP", "--allow-empty")
    assert rc == 0, err
    # On stderr, with the other notes: the table on stdout goes to files and pipes alone.
    assert err == "warning: scoring 1 empty caption (image ids 5)\n"
    assert "warning" not in stdout


def test_an_empty_split_is_named_with_its_file(tmp_path, karpathy, capsys):
    # It said "no hypotheses to score" with status 1, naming neither the file nor the split.
    results = _write(tmp_path / "r.json", [{"image_id": 5, "caption": "a dog"}])
    rc, _, err = _score(capsys, "--results", results, "--references", karpathy, "--split",
                        "val", "--metrics", "Bleu")
    assert (rc, err) == (2, f"captioner score: {karpathy}: split 'val' holds no images\n")
    rc, _, err = _score(capsys, "--results", results, "--references", karpathy, "--split",
                        "tset", "--metrics", "Bleu")
    assert rc == 2 and err.startswith(f"captioner score: {karpathy}: unknown split 'tset'"), err


def test_a_caption_of_punctuation_alone_is_empty(tmp_path, karpathy, capsys):
    # coco-caption's tokenizer keeps "!!!" as a word, so it was scored as a real caption
    # (REP 0, the best) with no word said; prepare-dataset drops such a reference as empty.
    results = _write(tmp_path / "r.json", [{"image_id": 5, "caption": "!!! ... ,,,"},
                                           {"image_id": 6, "caption": "a cat"}])
    rc, _, err = _score(capsys, "--results", results, "--references", karpathy, "--split",
                        "test", "--metrics", "REP")
    assert rc == 2 and "1 caption in" in err and "is empty, without a word (image ids 5)" in err
    rc, _, err = _score(capsys, "--results", results, "--references", karpathy, "--split",
                        "test", "--metrics", "REP", "--allow-empty")
    assert rc == 0 and err == "warning: scoring 1 empty caption (image ids 5)\n"


def test_a_karpathy_split_scores_its_images_and_leaves_out_other_splits_captions(
        tmp_path, karpathy, capsys):
    """Captions of a whole folder (test and train images here) scored on --split test: the
    split's images are scored, the others' captions left out and named; an id the file does
    not list stays an error."""
    split = [{"image_id": 5, "caption": "a dog dog runs"}, {"image_id": 6, "caption": "a cat"}]
    scores = {}
    for name, results in (("split", split),
                          ("folder", [*split, {"image_id": 7, "caption": "a dog"}])):
        path, out = _write(tmp_path / f"{name}.json", results), tmp_path / f"m_{name}.json"
        rc, _, err = _score(capsys, "--results", path, "--references", karpathy, "--split",
                            "test", "--metrics", "Bleu,REP", "--out", str(out))
        assert rc == 0, err
        scores[name] = json.loads(out.read_text())
        if name == "folder":
            assert err == (f"scoring the 2 images of split 'test'; the captions of 1 image of "
                           f"other splits in {path} are left out (image ids 7)\n")
    assert scores["folder"]["per_image"] == scores["split"]["per_image"]
    assert scores["folder"]["Bleu_4"] == scores["split"]["Bleu_4"]
    unknown = _write(tmp_path / "unknown.json",
                     [*split, {"image_id": 7, "caption": "a"}, {"image_id": 99, "caption": "b"}])
    rc, _, err = _score(capsys, "--results", unknown, "--references", karpathy, "--split",
                        "test", "--metrics", "Bleu")
    assert rc == 2
    assert err.endswith("1 image id of the results has no reference caption (99)\n")
    # Captions of another split only: the --split given is named as the likely mistake.
    other = _write(tmp_path / "other.json", [{"image_id": 7, "caption": "a dog"}])
    rc, _, err = _score(capsys, "--results", other, "--references", karpathy, "--split",
                        "test", "--metrics", "Bleu")
    assert rc == 2
    assert err.endswith(f"every caption in {other} is of split 'train', not 'test': is --split "
                        "right?\n"), err


@pytest.mark.parametrize(
    ("results", "message"),
    [
        ([{"image_id": 5, "caption": "a dog"}], "1 image id of the references has no caption"),
        (
            [{"image_id": 5, "caption": "a"}, {"image_id": 99, "caption": "c"}],
            r"cannot score .*r\.json: 1 image id of the results has no reference caption "
            r"\(99\); 1 image id of the references has no caption in the results \(6\)$",
        ),
        (
            [{"image_id": 5, "caption": "a"}, {"image_id": 6, "caption": "b"},
             {"image_id": 99, "caption": "c"}],
            r"1 image id of the results has no reference caption \(99\)",
        ),
        (
            [{"image_id": 5, "caption": "a"}, {"image_id": 5, "caption": "b"},
             {"image_id": 6, "caption": "c"}],
            r"1 image id has more than one caption \(5\); keep one caption per image",
        ),
        (
            [{"image_id": 5, "caption": " "}, {"image_id": 6, "caption": "c"}],
            r"1 caption in .* is empty, without a word \(image ids 5\); pass --allow-empty",
        ),
        ([{"image_id": "5", "caption": "a"}], "entry 0: image_id must be an integer"),
        ({"image_id": 5}, "COCO results must be a list"),
        ([], r"r\.json: holds no captions \(an empty list\)$"),
        ("[{", "not valid JSON"),
        # json raises RecursionError and a plain ValueError for these: the file is named too.
        ("[" * 100_000 + "]" * 100_000, r"r\.json: not valid JSON \(arrays or objects nested "
         r"too deeply: line 1 column 1 \(char 0\)\)$"),
        ('[{"image_id": ' + "9" * 5000 + ', "caption": "a"}]',
         r"r\.json: not valid JSON \(an integer too long \(Exceeds the limit \(4300 digits\) "
         r"for integer string conversion\)"),
    ],
)  # fmt: skip
def test_bad_results_are_reported(tmp_path, karpathy, capsys, results, message):
    path = _write(tmp_path / "r.json", results)
    rc, _, err = _score(
        capsys, "--results", path, "--references", karpathy, "--split", "test", "--metrics", "Bleu"
    )
    assert rc == 2
    [line] = err.splitlines()  # one line, however many problems
    assert re.search(message, line), err


@pytest.mark.parametrize(
    ("references", "message"),
    [
        # A COCO captions file without its annotations was taken for a Karpathy JSON.
        ({"images": [{"id": 5, "file_name": "a.jpg"}]}, "neither a COCO captions file (it has "
         "no field 'annotations') nor a Karpathy JSON (no field 'dataset')"),
        # An object in place of the list was read as no references at all.
        ({"images": [], "annotations": {"image_id": 5, "caption": "a"}}, "field 'annotations' "
         "must be a list of {'image_id', 'caption'} objects, got dict"),
        ({"annotations": [{"image_id": 5, "caption": "a"}, {"image_id": True, "caption": "b"}]},
         "annotations[1]: image_id must be an integer, got True"),
    ],
)  # fmt: skip
def test_a_coco_references_file_names_its_faulty_field(tmp_path, capsys, references, message):
    results = _write(tmp_path / "r.json", [{"image_id": 5, "caption": "a"}])
    refs = _write(tmp_path / "refs.json", references)
    rc, _, err = _score(capsys, "--results", results, "--references", refs, "--metrics", "Bleu")
    assert rc == 2
    assert err == f"captioner score: {refs}: {message}\n"


def test_reference_and_option_errors(tmp_path, karpathy, capsys):
    results = _write(tmp_path / "r.json", [{"image_id": 5, "caption": "a"}])
    rc, _, err = _score(capsys, "--results", results, "--references", karpathy)
    assert rc == 2 and "needs --split" in err
    rc, _, err = _score(capsys, "--results", results, "--references", str(tmp_path / "no.json"))
    assert rc == 2 and "references file not found" in err
    rc, _, err = _score(
        capsys, "--results", results, "--references", karpathy, "--split", "test",
        "--metrics", "Bleu,CIDER",
    )  # fmt: skip
    assert rc == 2 and "unknown metrics CIDER; choose from " in err


def test_spice_without_jars_names_fetch_spice(tmp_path, karpathy, capsys, monkeypatch):
    monkeypatch.setenv("CAPTIONER_SPICE_DIR", str(tmp_path / "empty"))
    results = _write(
        tmp_path / "r.json",
        [{"image_id": 5, "caption": "a dog"}, {"image_id": 6, "caption": "a cat"}],
    )
    rc, _, err = _score(
        capsys, "--results", results, "--references", karpathy, "--split", "test",
        "--metrics", "Bleu,SPICE",
    )  # fmt: skip
    assert rc == 2
    assert len(err.splitlines()) == 1 and err.startswith("captioner score: ")
    assert "captioner fetch-spice" in err
    assert re.search(r"\(\S+: missing; \S+: missing; \S+: missing and \d+ more\)", err)
    assert "or score without SPICE: --metrics Bleu" in err


@pytest.fixture
def never_scored(monkeypatch):
    """Fails the test if scoring starts: output paths must be refused before it."""
    import eval.metrics.scoring

    def refuse(*args, **kwargs):
        raise AssertionError("scoring started before the output path was checked")

    monkeypatch.setattr(eval.metrics.scoring, "compute_metrics", refuse)


@pytest.mark.parametrize(
    ("make_out", "message"),
    [
        (lambda tmp: tmp, "is a folder, expected a file name"),
        (lambda tmp: tmp / "file.txt" / "m.json", "file.txt is not a folder"),
        (lambda tmp: "/dev/full", "exists and is not a regular file"),
    ],
    ids=["existing-folder", "under-a-file", "device"],
)
def test_unusable_out_is_refused_before_scoring(
    tmp_path, karpathy, capsys, never_scored, make_out, message
):
    (tmp_path / "file.txt").write_text("not a folder")
    results = _write(
        tmp_path / "r.json",
        [{"image_id": 5, "caption": "a dog"}, {"image_id": 6, "caption": "a cat"}],
    )
    out = str(make_out(tmp_path))
    rc, stdout, err = _score(
        capsys, "--results", results, "--references", karpathy, "--split", "test",
        "--metrics", "Bleu", "--out", out,
    )  # fmt: skip
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("captioner score: ") and message in err, err
    assert stdout == ""
    assert (tmp_path / "file.txt").read_text() == "not a folder"


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a read-only folder")
def test_out_in_a_read_only_folder_is_refused_before_scoring(
    tmp_path, karpathy, capsys, never_scored
):
    folder = tmp_path / "read-only"
    folder.mkdir(mode=0o500)
    results = _write(tmp_path / "r.json", [{"image_id": 5, "caption": "a"}])
    rc, _, err = _score(
        capsys, "--results", results, "--references", karpathy, "--split", "test",
        "--out", str(folder / "m.json"),
    )  # fmt: skip
    assert rc == 2 and "is not writable" in err


def test_cider_of_a_single_image_is_nan_with_one_warning_line(tmp_path, capsys):
    references = _write(
        tmp_path / "refs.json",
        {
            "images": [{"id": 1}],
            "annotations": [{"image_id": 1, "id": 1, "caption": "A red circle."}],
        },
    )
    results = _write(tmp_path / "r.json", [{"image_id": 1, "caption": "a red circle"}])
    out = tmp_path / "m.json"
    rc, stdout, err = _score(
        capsys, "--results", results, "--references", references, "--metrics", "Bleu,CIDEr",
        "--out", str(out),
    )  # fmt: skip
    assert rc == 0, err
    assert err == (
        "warning: CIDEr is undefined (NaN) for a single image: its IDF weights log(N/df), "
        "taken from the references of the N images scored, are 0 when N = 1\n"
    )
    row = next(line for line in stdout.splitlines() if line.startswith("r "))
    assert row.split()[1:3] == ["-", "nan"]  # SPICE not requested, CIDEr undefined
    # Strict JSON: the undefined score is null (NaN is no JSON; strict readers refuse it).
    doc = json.loads(out.read_text(), parse_constant=lambda name: pytest.fail(name))
    assert doc["CIDEr"] is None and doc["per_image"]["1"]["CIDEr"] is None
    assert doc["Bleu_1"] == pytest.approx(1.0)


def test_the_library_refuses_ids_in_one_side_only_as_score_does():
    from eval.metrics.coco import coverage_problems, score_captions

    hypotheses = {1: "a dog", 2: "a cat", 5: "a bird"}
    references = {1: ["a dog"], 2: ["a cat"], 3: ["a cow"], 4: ["a hen"]}
    problems = coverage_problems(hypotheses, references)
    assert problems == [
        "1 image id of the results has no reference caption (5)",
        "2 image ids of the references have no caption in the results (3, 4)"]
    # Ids past the tenth are counted, not listed.
    many = coverage_problems(hypotheses, {i: ["a dog"] for i in range(1, 16)})
    assert many == ["12 image ids of the references have no caption in the results "
                    "(3, 4, 6, 7, 8, 9, 10, 11, 12, 13 and 2 more)"]
    with pytest.raises(ValueError) as error:
        score_captions(hypotheses, references, ["Bleu"])
    assert str(error.value) == "; ".join(problems)
    assert coverage_problems({1: "a dog"}, {1: ["a dog"]}) == []


def test_an_empty_reference_caption_is_named(tmp_path, capsys):
    references = _write(tmp_path / "refs.json", {
        "images": [{"id": 5}, {"id": 6}],
        "annotations": [{"id": 1, "image_id": 5, "caption": ""},
                        {"id": 2, "image_id": 5, "caption": "a dog"},
                        {"id": 3, "image_id": 6, "caption": "a cat"}]})
    results = _write(tmp_path / "r.json",
                     [{"image_id": 5, "caption": "a dog"}, {"image_id": 6, "caption": "a cat"}])
    rc, _, err = _score(capsys, "--results", results, "--references", references,
                        "--metrics", "REP")
    assert rc == 0, err
    assert (f"warning: 1 image of {references} has an empty reference caption (image ids 5), "
            "scored as a reference") in err


def test_a_coco_captions_file_scores_the_images_of_the_results(tmp_path, capsys):
    """Karpathy's test split is a part of val2014: against captions_val2014.json the results'
    images are scored, as coco-caption scores them; an id the references lack is refused."""
    annotations = [(5, "a dog runs on the grass"), (5, "a brown dog"), (6, "a cat on a sofa"),
                   (6, "a sleeping cat"), (7, "a red bus on a street"), (8, "two birds")]

    def coco(ids):
        return {"images": [{"id": i} for i in ids],
                "annotations": [{"id": k, "image_id": i, "caption": c}
                                for k, (i, c) in enumerate(annotations) if i in ids]}
    whole = _write(tmp_path / "captions_val.json", coco({5, 6, 7, 8}))
    part = _write(tmp_path / "captions_part.json", coco({5, 6, 7}))
    results = _write(tmp_path / "r.json", [{"image_id": 5, "caption": "a dog on grass"},
                                           {"image_id": 6, "caption": "a cat"},
                                           {"image_id": 7, "caption": "a bus"}])
    scores = {}
    for references in (whole, part):
        out = tmp_path / f"m_{os.path.basename(references)}"
        rc, _, err = _score(capsys, "--results", results, "--references", references,
                            "--metrics", "Bleu,CIDEr,REP", "--out", str(out))
        assert rc == 0, err
        scores[references] = json.loads(out.read_text())
        if references == whole:
            assert err == f"scoring the 3 images of {results}; {whole} holds references of 4\n"
        else:
            assert err == ""
    for name in ("Bleu_4", "CIDEr", "REP", "per_image"):
        assert scores[whole][name] == scores[part][name]
    extra = _write(tmp_path / "r2.json", [{"image_id": 5, "caption": "a dog"},
                                          {"image_id": 99, "caption": "a cow"}])
    rc, _, err = _score(capsys, "--results", extra, "--references", whole, "--metrics", "Bleu")
    [line] = err.splitlines()  # the refusal alone, not the count of what was to be scored
    assert rc == 2 and "1 image id of the results has no reference caption (99)" in line


def test_captions_named_after_other_images_than_the_references_ids_are_refused(
        tmp_path, karpathy, capsys):
    # As `caption --format coco` writes them: each record names its file. Scored against
    # another numbering (a converted dataset's), every caption would meet another image's
    # references: refused, naming the first that differ.
    results = _write(tmp_path / "r.json", [
        {"image_id": 5, "caption": "a cat", "file_name": "photos/6.jpg"},
        {"image_id": 6, "caption": "a dog runs", "file_name": "photos/5.jpg"},
    ])
    rc, _, err = _score(capsys, "--results", results, "--references", karpathy, "--split",
                        "test", "--metrics", "Bleu")
    assert rc == 2
    assert err == (
        f"captioner score: {results}: 2 of its 2 captions name another image than {karpathy} "
        f"gives its image id (image id 5: photos/6.jpg, but 5.jpg in {karpathy}; image id 6: "
        f"photos/5.jpg, but 6.jpg in {karpathy}); `captioner caption --format coco` takes ids "
        "from COCO file names (or input positions), not a converted dataset's: score a "
        "dataset's split with `captioner evaluate`\n")
    # The same captions under the ids the references give their files are scored.
    _write(tmp_path / "r.json", [
        {"image_id": 6, "caption": "a cat", "file_name": "photos/6.jpg"},
        {"image_id": 5, "caption": "a dog runs", "file_name": "photos/5.jpg"},
    ])
    rc, stdout, err = _score(capsys, "--results", results, "--references", karpathy, "--split",
                             "test", "--metrics", "Bleu")
    assert rc == 0 and err == "" and "2 images" in stdout


def test_captions_of_files_the_references_number_otherwise_are_refused(tmp_path, karpathy,
                                                                       capsys):
    # Flickr30k's file names are no COCO names, so `caption --format coco` numbers them by
    # position, ids the split file does not use: refused as "no reference caption" without
    # saying why. Now the files the references give other ids are named, with the way out.
    results = _write(tmp_path / "r.json", [
        {"image_id": 1000000, "caption": "a cat", "file_name": "photos/5.jpg"},
        {"image_id": 1000001, "caption": "a dog runs", "file_name": "photos/6.jpg"},
    ])
    rc, _, err = _score(capsys, "--results", results, "--references", karpathy, "--split",
                        "test", "--metrics", "Bleu")
    assert rc == 2
    assert err == (
        f"captioner score: {results}: 2 of its 2 captions name another image than {karpathy} "
        f"gives its image id (image id 1000000: photos/5.jpg, image id 5 in {karpathy}; image "
        f"id 1000001: photos/6.jpg, image id 6 in {karpathy}); `captioner caption --format "
        "coco` takes ids from COCO file names (or input positions), not a converted "
        "dataset's: score a dataset's split with `captioner evaluate`\n")


def test_captions_are_checked_against_a_coco_files_images_when_it_lists_them(tmp_path, capsys):
    annotations = [{"image_id": 5, "caption": "a dog runs"}, {"image_id": 6, "caption": "a cat"}]
    results = _write(tmp_path / "r.json", [
        {"image_id": 5, "caption": "a cat", "file_name": "val2014/COCO_val2014_000000000006.jpg"},
        {"image_id": 6, "caption": "a dog", "file_name": "val2014/COCO_val2014_000000000006.jpg"},
    ])
    refs = _write(tmp_path / "refs.json", {"annotations": annotations, "images": [
        {"id": 5, "file_name": "COCO_val2014_000000000005.jpg"},
        {"id": 6, "file_name": "COCO_val2014_000000000006.jpg"}]})
    rc, _, err = _score(capsys, "--results", results, "--references", refs, "--metrics", "Bleu")
    assert rc == 2
    assert err.startswith(
        f"captioner score: {results}: 1 of its 2 captions names another image than {refs} gives "
        f"its image id (image id 5: val2014/COCO_val2014_000000000006.jpg, but "
        f"COCO_val2014_000000000005.jpg in {refs});")
    # A captions file without the list of its images cannot be checked, and says so.
    _write(tmp_path / "refs.json", {"annotations": annotations})
    rc, _, err = _score(capsys, "--results", results, "--references", refs, "--metrics", "Bleu")
    assert rc == 0
    assert err == (f"warning: {refs} names no image files, so the image ids of the captions in "
                   f"{results} are not checked against their file names\n")
