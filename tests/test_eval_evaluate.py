"""`captioner evaluate` on the shared tiny TVmax checkpoint and synthetic data."""

import json
import shutil
from pathlib import Path

import pytest

from eval.commands import evaluate, score

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


def _instances_variants(synthetic_data, tmp_path) -> dict[str, tuple[str, str]]:
    """name -> (instances file, what the error line must say)."""
    good = json.loads(synthetic_data.instances["test"].read_text())
    variants = {
        "captions_file": ({"images": good["images"], "annotations": []},
                          "not a COCO instances file: it lacks the list 'categories'"),
        "images_not_a_list": ({**good, "images": "x"},
                              "not a COCO instances file: field 'images' must be a list, got str"),
        "unknown_category": ({**good, "annotations": [{**good["annotations"][0],
                                                        "category_id": 999}]},
                             "annotations[0].category_id 999 is not the id of any of its "
                             "categories"),
        "no_height": ({**good, "images": [{"id": 1, "width": 3}]}, "images[0] lacks field "
                      "'height'"),
        "wrong_size": ({**good, "images": [{**good["images"][0], "width": 999},
                                           *good["images"][1:]]},
                       f"image {good['images'][0]['id']} is 999x{good['images'][0]['height']} "
                       "there, but "),
        "own_category": ({**good, "categories": [{**good["categories"][0], "name": "zebra_thing"},
                                                 *good["categories"][1:]]},
                         "no synonym list for categories zebra_thing (known: COCO and "),
    }
    files = {}
    for name, (document, message) in variants.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(document))
        files[name] = (str(path), f"{path}: {message}")
    png = tmp_path / "picture.json"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    files["png"] = (str(png), f"{png}: not a JSON file")
    train = synthetic_data.instances["train"]
    files["other_split"] = (str(train), f"{train}: has no image ")
    return files


def test_a_wrong_instances_file_is_named_before_any_captioning(synthetic_data, tiny_checkpoint,
                                                               tmp_path, capsys, monkeypatch):
    from captioner.inference.pipeline import Captioner

    def refuse(*args, **kwargs):
        raise AssertionError("captioned before the instances file was checked")

    monkeypatch.setattr(Captioner, "caption", refuse)
    for name, (instances, message) in _instances_variants(synthetic_data, tmp_path).items():
        argv = [
            "--ckpt", str(tiny_checkpoint), "--data", str(synthetic_data.karpathy_json),
            "--images", str(synthetic_data.image_root), "--split", "test",
            "--instances", instances, "--metrics", "Bleu", "--out", str(tmp_path / name),
        ]  # fmt: skip
        assert evaluate.main(argv) == 2, name
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"captioner evaluate: {message}") and "\n" not in err, (name, err)


def test_an_undefined_metric_is_one_warning_line(synthetic_data, tiny_checkpoint, tmp_path,
                                                 capsys):
    data = json.loads(synthetic_data.karpathy_json.read_text())
    first_test = next(i for i, image in enumerate(data["images"]) if image["split"] == "test")
    data["images"] = [image for i, image in enumerate(data["images"])
                      if image["split"] != "test" or i == first_test]
    one = tmp_path / "one_test_image.json"
    one.write_text(json.dumps(data))
    argv = ["--ckpt", str(tiny_checkpoint), "--data", str(one), "--images",
            str(synthetic_data.image_root), "--metrics", "CIDEr", "--beam-size", "1",
            "--no-progress", "--out", str(tmp_path / "eval")]
    assert evaluate.main(argv) == 0
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "CIDEr" in line] == [
        line for line in err.splitlines() if line.startswith("warning: CIDEr")]
    assert "warning: CIDEr" in err and "UserWarning" not in err


def _evaluate_with_metrics_raising(error: BaseException, data, checkpoint, out: Path,
                                   monkeypatch) -> int:
    """``captioner evaluate`` into ``out`` whose metrics raise ``error`` once the captions are
    written; its exit status."""
    import eval.metrics.scoring

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(eval.metrics.scoring, "compute_metrics", fail)
    return evaluate.main([
        "--ckpt", str(checkpoint), "--data", str(data.karpathy_json), "--images",
        str(data.image_root), "--metrics", "Bleu", "--beam-size", "1", "--no-progress", "--out",
        str(out)])


def test_captions_are_kept_when_a_metric_fails_after_them(synthetic_data, tiny_checkpoint,
                                                          tmp_path, capsys, monkeypatch):
    # The metrics' failure is the work's (status 1, as in `score`), not a user error (2).
    out = tmp_path / "eval"
    assert _evaluate_with_metrics_raising(ValueError("SPICE stopped"), synthetic_data,
                                          tiny_checkpoint, out, monkeypatch) == 1
    results, metrics = out / "results_test.json", out / "metrics_test.json"
    assert capsys.readouterr().err.strip() == (
        f"captioner evaluate: SPICE stopped (the captions are kept in {results}; captioner score "
        f"--results {results} --references {synthetic_data.karpathy_json} --split test --out "
        f"{metrics} --metrics Bleu scores them; the attention statistics need a new evaluation: "
        "--overwrite)")
    assert len(json.loads(results.read_text())) == 4
    assert not metrics.exists()


def test_ctrl_c_in_the_metrics_says_where_the_captions_are_kept(
        synthetic_data, tiny_checkpoint, tmp_path, capsys, monkeypatch):
    # Ctrl-C while SPICE runs: the captions stay, and the line says how to go on (the same
    # command is refused now that they are in --out).
    out = tmp_path / "eval"
    assert _evaluate_with_metrics_raising(KeyboardInterrupt(), synthetic_data, tiny_checkpoint,
                                          out, monkeypatch) == 130
    results, metrics = out / "results_test.json", out / "metrics_test.json"
    line = capsys.readouterr().err.strip()
    assert line == (
        f"captioner evaluate: interrupted; the captions are kept in {results} (captioner score "
        f"--results {results} --references {synthetic_data.karpathy_json} --split test --out "
        f"{metrics} --metrics Bleu scores them; the attention statistics need a new evaluation: "
        "--overwrite)")
    assert len(json.loads(results.read_text())) == 4
    # The command it gives writes the evaluation's metrics file beside the captions.
    monkeypatch.undo()
    command = line.partition("(captioner score ")[2].partition(" scores them")[0]
    assert score.main(command.split()) == 0
    assert json.loads(metrics.read_text())["Bleu_4"] >= 0


def test_spice_timeout_reaches_the_metrics_and_the_line_after_ctrl_c(
        synthetic_data, tiny_checkpoint, tmp_path, capsys, monkeypatch):
    import shlex

    import eval.metrics.scoring
    from eval.commands.score import build_parser as score_parser

    timeouts = []

    def interrupted(*args, spice_timeout=None, **kwargs):
        timeouts.append(spice_timeout)
        raise KeyboardInterrupt

    monkeypatch.setattr(eval.metrics.scoring, "compute_metrics", interrupted)
    out = tmp_path / "my eval"  # the command is quoted for a shell: pasted, it works
    assert evaluate.main([
        "--ckpt", str(tiny_checkpoint), "--data", str(synthetic_data.karpathy_json), "--images",
        str(synthetic_data.image_root), "--metrics", "Bleu,SPICE", "--spice-timeout", "1800",
        "--beam-size", "1", "--no-progress", "--out", str(out)]) == 130
    assert timeouts == [1800.0]
    line = capsys.readouterr().err.strip()
    command = line.partition("(captioner score ")[2].partition(" scores them")[0]
    assert command.endswith("--metrics Bleu,SPICE --spice-timeout 1800")
    given = score_parser().parse_args(shlex.split(command))
    assert (given.metrics, given.spice_timeout) == ("Bleu,SPICE", 1800.0)
    assert str(given.results) == str(out / "results_test.json")


def test_an_earlier_evaluation_in_out_is_kept_unless_overwrite(synthetic_data, tiny_checkpoint,
                                                                tmp_path, capsys, monkeypatch):
    import eval.metrics.scoring

    out = tmp_path / "evaluation"
    argv = ["--ckpt", str(tiny_checkpoint), "--data", str(synthetic_data.karpathy_json),
            "--images", str(synthetic_data.image_root), "--metrics", "Bleu", "--beam-size", "1",
            "--no-progress", "--out", str(out)]
    assert evaluate.main(argv) == 0
    capsys.readouterr()
    results, metrics = out / "results_test.json", out / "metrics_test.json"
    earlier = (results.read_bytes(), metrics.read_bytes())
    # Another checkpoint's or decoding's evaluation into the same --out (the default one).
    assert evaluate.main([*argv, "--beam-size", "2"]) == 2
    assert capsys.readouterr().err == (
        f"captioner evaluate: {results}: holds an earlier evaluation of split 'test'; choose "
        "another --out, or pass --overwrite to replace it\n")
    assert (results.read_bytes(), metrics.read_bytes()) == earlier
    # Another split goes beside it.
    assert evaluate.main([*argv, "--split", "val"]) == 0
    assert (out / "metrics_val.json").is_file() and metrics.read_bytes() == earlier[1]
    # With --overwrite, new metrics that fail leave the earlier evaluation whole, and the new
    # captions beside it, with the command that scores them.
    def fail(*args, **kwargs):
        raise ValueError("SPICE stopped")

    monkeypatch.setattr(eval.metrics.scoring, "compute_metrics", fail)
    assert evaluate.main([*argv, "--beam-size", "2", "--overwrite"]) == 1
    staged = out / "results_test.new.json"
    assert capsys.readouterr().err.strip() == (
        f"captioner evaluate: SPICE stopped (the new captions are kept in {staged}, and the "
        f"earlier evaluation in {out} is unchanged; captioner score --results {staged} "
        f"--references {synthetic_data.karpathy_json} --split test --out "
        f"{out / 'metrics_test.new.json'} --metrics Bleu scores them; the attention statistics "
        "need a new evaluation: --overwrite)")
    assert (results.read_bytes(), metrics.read_bytes()) == earlier
    new_captions = json.loads(staged.read_text())
    assert len(new_captions) == 4
    # The scores of those staged captions, as the command above writes them; a later
    # --overwrite replaces the staged captions, and with them these scores.
    (out / "metrics_test.new.json").write_text("{}")
    assert evaluate.main([*argv, "--beam-size", "2", "--overwrite"]) == 1
    assert capsys.readouterr().err.splitlines()[0] == (
        f"captioner evaluate: removed {out / 'metrics_test.new.json'}: it scored the earlier "
        f"new captions that {staged} now replaces")
    assert not (out / "metrics_test.new.json").exists()
    # Once its metrics are made, the new evaluation replaces the earlier one wholly.
    monkeypatch.undo()
    assert evaluate.main([*argv, "--beam-size", "2", "--overwrite"]) == 0
    assert not staged.exists()
    assert (results.read_bytes(), metrics.read_bytes()) != earlier
    assert json.loads(results.read_text()) == new_captions  # beam 2 again: the same
    assert json.loads(metrics.read_text())["Bleu_4"] >= 0


def test_a_stop_while_the_evaluation_is_put_in_place_waits_for_it(synthetic_data,
                                                                   tiny_checkpoint, tmp_path,
                                                                   monkeypatch):
    """Ctrl-C between the removal of the earlier metrics and the write of the new ones left
    the new captions alone, the earlier metrics and the new ones both lost."""
    import os
    import signal

    import data_prep.atomic

    out = tmp_path / "evaluation"
    argv = ["--ckpt", str(tiny_checkpoint), "--data", str(synthetic_data.karpathy_json),
            "--images", str(synthetic_data.image_root), "--metrics", "Bleu", "--beam-size", "1",
            "--no-progress", "--out", str(out)]
    assert evaluate.main(argv) == 0
    write_json = data_prep.atomic.write_json

    def stopped_while_writing(path, *args, **kwargs):
        if Path(path).name == "metrics_test.json":
            os.kill(os.getpid(), signal.SIGINT)
        write_json(path, *args, **kwargs)

    monkeypatch.setattr(data_prep.atomic, "write_json", stopped_while_writing)
    with pytest.raises(KeyboardInterrupt):
        evaluate.main([*argv, "--beam-size", "2", "--overwrite"])
    assert sorted(path.name for path in out.iterdir()) == ["metrics_test.json",
                                                           "results_test.json"]
    assert json.loads((out / "metrics_test.json").read_text())["Bleu_4"] >= 0


def test_empty_captions_are_scored_with_a_warning_and_the_resume_line_scores_them(
        synthetic_data, tiny_checkpoint, tmp_path, capsys, monkeypatch):
    """An under-trained model's empty captions: evaluate scores them (and says so), so the
    score command its Ctrl-C line gives must score them too."""
    import dataclasses

    from captioner.inference.pipeline import Captioner

    original = Captioner.caption

    def some_empty(self, *args, **kwargs):
        captions = original(self, *args, **kwargs)
        return [dataclasses.replace(c, text="", tokens=[]) if i % 2 else c
                for i, c in enumerate(captions)]

    monkeypatch.setattr(Captioner, "caption", some_empty)
    out = tmp_path / "eval"
    assert _evaluate_with_metrics_raising(KeyboardInterrupt(), synthetic_data, tiny_checkpoint,
                                          out, monkeypatch) == 130
    err = capsys.readouterr().err
    results = out / "results_test.json"
    empty = [r["image_id"] for r in json.loads(results.read_text()) if not r["caption"]]
    assert len(empty) == 2
    assert f"warning: scoring 2 empty captions (image ids {empty[0]}, {empty[1]})" in err
    command = err.split("(captioner score ")[1].split(" scores them;")[0].split()
    assert command[-3:] == ["--metrics", "Bleu", "--allow-empty"]  # evaluate's own metrics
    monkeypatch.undo()
    assert score.main(command) == 0


def test_an_input_where_an_output_goes_is_refused_with_overwrite_too(synthetic_data,
                                                                    tiny_checkpoint, tmp_path,
                                                                    capsys):
    out = tmp_path / "eval"
    out.mkdir()
    data = out / "results_test.json"
    shutil.copy(synthetic_data.karpathy_json, data)
    before = data.read_bytes()
    argv = ["--ckpt", str(tiny_checkpoint), "--data", str(data), "--images",
            str(synthetic_data.image_root), "--metrics", "Bleu", "--out", str(out), "--no-progress"]
    for extra in ([], ["--overwrite"]):
        assert evaluate.main([*argv, *extra]) == 2
        assert capsys.readouterr().err == (
            f"captioner evaluate: {data}: is the dataset file this command reads; writing the "
            "output there would replace it\n")
    assert data.read_bytes() == before


def test_an_undefined_statistic_is_shown_as_not_applicable_with_its_reason():
    from eval.evaluation import EvaluationReport

    report = EvaluationReport(
        metrics={"CIDEr": 0.5}, attention={"zero_share": 0.25},
        objects={"object_recall": 0.5, "object_precision": float("nan")}, results=[],
        per_image={}, info={"output_attention": "tvmax", "split": "test"})
    lines = report.summary().splitlines()
    assert "  object_precision n/a" in lines  # aligned on the longest name
    assert "  object_recall    0.5000" in lines
    assert lines[-1].startswith("  (n/a: undefined here")
