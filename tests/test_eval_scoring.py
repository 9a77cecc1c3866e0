"""`captioner score` end to end with every metric, SPICE for real (one run per session), checked
against pycocoevalcap called directly and against the SPICE jar run by hand."""

import contextlib
import io
import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from eval.commands import score
from eval.metrics.rep import rep_per_image, rep_score
from eval.metrics.spice_jars import PYCOCOEVALCAP_SPICE_DIR, locate_spice

pytestmark = pytest.mark.java

REFERENCES = {
    11: ["A man rides a brown horse on the beach.", "A person riding a horse near the ocean."],
    12: ["A red circle above a blue square.", "A blue square below a red circle."],
    13: ["Two dogs play in the green grass.", "A pair of dogs running on a lawn."],
    14: ["Two dogs play in the green grass.", "A pair of dogs running on a lawn."],
}
HYPOTHESES = {
    11: "A man riding a horse on the beach.",
    12: "a red circle above a blue blue square",
    13: "two dogs playing in the grass",
    14: "a cat sleeping on a red sofa",  # same references as 13: SPICE must differ
}
INSTALL_DIRS = ("tokenizer", "meteor", "spice")


def _dir_mtimes() -> dict[str, int]:
    root = PYCOCOEVALCAP_SPICE_DIR.parent
    return {name: (root / name).stat().st_mtime_ns for name in INSTALL_DIRS}


@pytest.fixture(scope="session")
def scored(tmp_path_factory):
    folder = tmp_path_factory.mktemp("score")
    refs = folder / "refs.json"
    refs.write_text(
        json.dumps(
            {
                "images": [{"id": i} for i in REFERENCES],
                "annotations": [
                    {"image_id": i, "id": 10 * i + k, "caption": c}
                    for i, caps in REFERENCES.items()
                    for k, c in enumerate(caps)
                ],
            }
        )
    )
    results = folder / "results.json"
    results.write_text(json.dumps([{"image_id": i, "caption": c} for i, c in HYPOTHESES.items()]))
    out = folder / "metrics.json"
    before = _dir_mtimes()
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        rc = score.main(["--results", str(results), "--references", str(refs), "--out", str(out)])
    after = _dir_mtimes()
    return SimpleNamespace(
        rc=rc,
        stdout=stdout.getvalue(),
        doc=json.loads(out.read_text()) if out.is_file() else None,
        mtimes_before=before,
        mtimes_after=after,
        folder=folder,
    )


@pytest.fixture(scope="module")
def reference_tokens():
    """Hypotheses and references tokenized by pycocoevalcap's own PTBTokenizer."""
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    tokenizer = PTBTokenizer()
    gts = tokenizer.tokenize({i: [{"caption": c} for c in v] for i, v in REFERENCES.items()})
    res = tokenizer.tokenize({i: [{"caption": c}] for i, c in HYPOTHESES.items()})
    return gts, res


def test_score_command_writes_every_metric(scored):
    assert scored.rc == 0, scored.stdout
    keys = ["Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr", "SPICE", "REP"]
    assert [k for k in scored.doc if k not in ("per_image", "info")] == keys
    assert set(scored.doc["per_image"]) == {str(i) for i in HYPOTHESES}
    assert scored.doc["info"]["num_images"] == 4
    table = scored.stdout.split("SPICE")[-1]
    assert "CIDEr" in table and "REP" in table
    assert f"{100 * scored.doc['SPICE']:.1f}" in scored.stdout


def test_coco_metrics_equal_pycocoevalcap(scored, reference_tokens):
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.meteor.meteor import Meteor
    from pycocoevalcap.rouge.rouge import Rouge

    gts, res = reference_tokens
    doc = scored.doc
    bleu, bleu_per_image = Bleu(4).compute_score(gts, res, verbose=0)
    for n in range(4):
        assert doc[f"Bleu_{n + 1}"] == bleu[n]
        for k, i in enumerate(gts):
            assert doc["per_image"][str(i)][f"Bleu_{n + 1}"] == bleu_per_image[n][k]
    meteor = Meteor()
    meteor_score, meteor_per_image = meteor.compute_score(gts, res)
    del meteor
    assert doc["METEOR"] == meteor_score
    for name, (corpus, per_image) in {
        "METEOR": (meteor_score, meteor_per_image),
        "ROUGE_L": Rouge().compute_score(gts, res),
        "CIDEr": Cider().compute_score(gts, res),
    }.items():
        assert doc[name] == pytest.approx(corpus, rel=1e-12, abs=0)
        for k, i in enumerate(gts):
            assert doc["per_image"][str(i)][name] == pytest.approx(per_image[k], rel=1e-12)


def test_spice_equals_the_jar_run_by_hand(scored, reference_tokens, tmp_path):
    gts, res = reference_tokens
    install = locate_spice()
    records = [{"image_id": i, "test": res[i][0], "refs": gts[i]} for i in sorted(gts)]
    (tmp_path / "in.json").write_text(json.dumps(records))
    cmd = [
        "java", "-Xmx3g", "--module-path", str(install.modules_dir),
        "--add-modules", "org.openjdk.nashorn", "-jar", str(install.jar),
        "in.json", "-out", "out.json", "-subset", "-silent",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    by_hand = {
        r["image_id"]: r["scores"]["All"]["f"]
        for r in json.loads((tmp_path / "out.json").read_text())
    }
    for i, f in by_hand.items():
        assert scored.doc["per_image"][str(i)]["SPICE"] == f
    assert scored.doc["SPICE"] == float(np.mean(list(by_hand.values())))


def test_spice_of_several_systems_in_one_run_equals_one_run_each(scored):
    from eval.metrics.scoring import spice_of_systems

    # Images 13 and 14 share their references: swapping their captions swaps their scores.
    swapped = {**HYPOTHESES, 13: HYPOTHESES[14], 14: HYPOTHESES[13]}
    scores = spice_of_systems({"given": HYPOTHESES, "swapped": swapped}, REFERENCES)
    single = {int(i): s["SPICE"] for i, s in scored.doc["per_image"].items()}
    assert scores["given"] == (scored.doc["SPICE"], single)
    corpus, per_image = scores["swapped"]
    assert per_image == {**single, 13: single[14], 14: single[13]}
    assert corpus == pytest.approx(scored.doc["SPICE"])
    with pytest.raises(ValueError, match="image ids must be >= 0"):
        spice_of_systems({"a": {-1: "a cat"}}, {-1: ["a cat"]})


def test_spice_differs_for_different_captions(scored):
    per_image = scored.doc["per_image"]
    assert per_image["13"]["SPICE"] > per_image["14"]["SPICE"]
    assert 0.0 <= per_image["14"]["SPICE"] < 0.5


def test_rep_uses_ptb_tokenized_lowercased_words(scored, reference_tokens):
    gts, res = reference_tokens
    ids = list(gts)
    hyps = [res[i][0] for i in ids]
    refs = [gts[i] for i in ids]
    assert scored.doc["REP"] == pytest.approx(rep_score(hyps, refs))
    # "blue blue" in image 12: consecutive repetition absent from its references -> 2 + ...
    assert [scored.doc["per_image"][str(i)]["REP"] for i in ids] == rep_per_image(hyps, refs)
    assert scored.doc["per_image"]["12"]["REP"] == pytest.approx(100 * 2 / 7)


def test_the_installed_packages_are_not_written_to(scored):
    # creating or deleting a temporary file in a folder changes the folder's mtime
    assert scored.mtimes_after == scored.mtimes_before
    assert not (Path(PYCOCOEVALCAP_SPICE_DIR) / "tmp").exists()


def test_rep_is_nan_with_a_warning_when_every_caption_is_empty():
    from eval.metrics.scoring import compute_metrics

    references = {1: ["a red circle", "one red circle"], 2: ["a blue square", "blue square"]}
    with pytest.warns(UserWarning, match="every caption is empty"):
        scores = compute_metrics({1: "", 2: ""}, references, ("Bleu", "REP"))
    assert np.isnan(scores.corpus["REP"])
    assert scores.corpus["Bleu_4"] == pytest.approx(0.0, abs=1e-6)
    assert all(np.isnan(scores.per_image[i]["REP"]) for i in (1, 2))


def test_cider_of_a_single_image_is_nan_with_a_warning():
    from eval.metrics.scoring import compute_metrics

    # pycocoevalcap gives 0.0 here even for a caption equal to its reference: log(N/df) = 0.
    references = {7: ["a red circle above a blue square", "a blue square under a red circle"]}
    with pytest.warns(UserWarning, match=r"CIDEr is undefined \(NaN\) for a single image") as w:
        scores = compute_metrics({7: "a red circle above a blue square"}, references, ("CIDEr",))
    assert len(w) == 1
    assert np.isnan(scores.corpus["CIDEr"]) and np.isnan(scores.per_image[7]["CIDEr"])


def test_cider_of_two_images_equals_pycocoevalcap(reference_tokens):
    import warnings

    from pycocoevalcap.cider.cider import Cider

    from eval.metrics.scoring import compute_metrics

    gts, res = reference_tokens
    ids = [11, 12]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scores = compute_metrics(
            {i: HYPOTHESES[i] for i in ids}, {i: REFERENCES[i] for i in ids}, ("CIDEr",)
        )
    corpus, per_image = Cider().compute_score({i: gts[i] for i in ids}, {i: res[i] for i in ids})
    assert corpus > 0
    assert scores.corpus["CIDEr"] == corpus
    assert [scores.per_image[i]["CIDEr"] for i in ids] == list(per_image)
