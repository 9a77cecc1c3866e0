"""`captioner evaluate` on the shared tiny TVmax checkpoint and synthetic data."""

import json

import pytest

from eval.commands import evaluate

pytestmark = pytest.mark.java


def test_evaluate_writes_results_metrics_attention_and_objects(
    synthetic_data, tiny_checkpoint, tmp_path, capsys
):
    out = tmp_path / "eval"
    argv = [
        "--ckpt", str(tiny_checkpoint), "--data", str(synthetic_data.karpathy_json),
        "--images", str(synthetic_data.image_root), "--split", "test",
        "--instances", str(synthetic_data.instances["test"]), "--beam-size", "2",
        "--metrics", "Bleu,CIDEr,REP", "--out", str(out),
    ]  # fmt: skip
    assert evaluate.main(argv) == 0, capsys.readouterr().err
    stdout = capsys.readouterr().out
    results = json.loads((out / "results_test.json").read_text())
    assert len(results) == 4 and all(set(r) == {"image_id", "caption"} for r in results)
    doc = json.loads((out / "metrics_test.json").read_text())
    assert {"Bleu_4", "CIDEr", "REP"} <= set(doc)
    assert not {"METEOR", "ROUGE_L", "SPICE"} & set(doc)  # only the requested metrics
    stats = doc["attention"]
    assert 0.0 <= stats["zero_attention"] <= 1.0
    assert 1.0 <= stats["support_size"] <= 16.0  # 4 x 4 grid
    assert stats["fused_groups"] >= 1.0
    assert set(doc["objects"]) == {
        "object_recall", "object_precision", "attention_precision", "attention_precision_words",
        "attention_precision_phrase", "attention_precision_phrase_words"
    }  # fmt: skip
    assert doc["info"]["output_attention"] == "tvmax"
    assert "attention statistics:" in stdout and "REP" in stdout


def test_evaluate_reports_a_missing_checkpoint(synthetic_data, tmp_path, capsys):
    argv = [
        "--ckpt", str(tmp_path / "none.ckpt"), "--data", str(synthetic_data.karpathy_json),
        "--images", str(synthetic_data.image_root), "--metrics", "Bleu",
    ]  # fmt: skip
    assert evaluate.main(argv) == 2
    assert "none.ckpt" in capsys.readouterr().err
