"""`captioner score` input handling (no SPICE here: see test_eval_scoring.py)."""

import json
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
    images.append({**images[0], "cocoid": 7, "imgid": 2, "split": "train"})
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
    assert doc["per_image"]["5"]["REP"] == 2.0  # "dog dog": consecutive, absent from refs
    row = next(line for line in stdout.splitlines() if line.startswith("r "))
    assert row.split()[1] == "-"  # SPICE not requested: shown as '-', never silently dropped


@pytest.mark.parametrize(
    ("results", "message"),
    [
        ([{"image_id": 5, "caption": "a dog"}], "image ids of the references have no caption"),
        (
            [{"image_id": 5, "caption": "a"}, {"image_id": 6, "caption": "b"},
             {"image_id": 99, "caption": "c"}],
            r"1 image ids are in the results but not in the references \(first: \[99\]\)",
        ),
        (
            [{"image_id": 5, "caption": "a"}, {"image_id": 5, "caption": "b"},
             {"image_id": 6, "caption": "c"}],
            r"1 image ids have more than one caption \(first: \[5\]\)",
        ),
        (
            [{"image_id": 5, "caption": " "}, {"image_id": 6, "caption": "c"}],
            r"1 captions in .* are empty \(image ids \[5\]\); pass --allow-empty",
        ),
        ([{"image_id": "5", "caption": "a"}], "entry 0: image_id must be an integer"),
        ({"image_id": 5}, "COCO results must be a list"),
        ("[{", "not valid JSON"),
    ],
)  # fmt: skip
def test_bad_results_are_reported(tmp_path, karpathy, capsys, results, message):
    path = _write(tmp_path / "r.json", results)
    rc, _, err = _score(
        capsys, "--results", path, "--references", karpathy, "--split", "test", "--metrics", "Bleu"
    )
    assert rc == 2
    assert re.search(message, err), err


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
    assert rc == 2 and "unknown metrics ['CIDER']" in err


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
    assert rc == 1
    assert "captioner fetch-spice" in err
