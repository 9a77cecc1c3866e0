"""`captioner demo --quick`: the whole pipeline end to end on a tiny synthetic dataset."""

from __future__ import annotations

import json
import math

import pytest

from captioner.inference.pipeline import Captioner
from data_prep.synthetic import SyntheticDataset
from eval.commands.demo import main
from eval.demo.steps import MAPPINGS, QUICK, dataset_dir, load_test_split, score_spice

# The module's demo run is made once and read by the tests that share it (one worker).
SHARED_RUN = pytest.mark.xdist_group("quick_demo")


@pytest.fixture(scope="module")
def resumed_demo(tmp_path_factory):
    """One quick demo run, made the way a user makes it after a Ctrl-C: stopped as its tvmax
    captioner starts training, then the same command again, which goes on; then the tvmax
    captioner trained again, for one epoch, from the config its run folder keeps.

    A SimpleNamespace of ``out`` (the run's folder), ``stopped`` (status, stderr, and the
    checkpoints then in ``out``, of the first command), ``finished`` (status and stdout of the
    second) and ``refit`` (status of the fit from ``runs/demo_tvmax/version_0/config.yaml``).
    Tests only read it.
    """
    from contextlib import redirect_stderr, redirect_stdout
    from io import StringIO
    from types import SimpleNamespace

    import captioner.training.cli
    from captioner.commands.lightning import main as lightning_main

    out = tmp_path_factory.mktemp("quick_demo") / "demo"
    build_cli = captioner.training.cli.build_cli

    def ctrl_c_at_tvmax(args, run):
        if any(arg.endswith("demo_tvmax.yaml") for arg in args):
            raise KeyboardInterrupt
        return build_cli(args, run=run)

    printed, said = StringIO(), StringIO()
    with pytest.MonkeyPatch.context() as patch, redirect_stdout(printed), redirect_stderr(said):
        patch.setattr(captioner.training.cli, "build_cli", ctrl_c_at_tvmax)
        code = main(["--quick", "--out", str(out)])
    stopped = SimpleNamespace(code=code, err=said.getvalue(),
                              checkpoints=sorted(p.name for p in out.glob("*.ckpt")))
    printed = StringIO()
    with redirect_stdout(printed):
        code = main(["--quick", "--out", str(out)])
    finished = SimpleNamespace(code=code, out=printed.getvalue())
    config = out / "runs" / "demo_tvmax" / "version_0" / "config.yaml"
    refit = lightning_main(["fit", "--config", str(config), "--trainer.max_epochs", "1",
                            "--trainer.enable_progress_bar", "false"])
    return SimpleNamespace(out=out, stopped=stopped, finished=finished, refit=refit)


@pytest.mark.demo
@pytest.mark.java
@SHARED_RUN
def test_quick_demo_writes_results_checkpoints_and_figures(resumed_demo):
    out = resumed_demo.out
    assert resumed_demo.finished.code == 0
    printed = resumed_demo.finished.out
    assert str(out) in printed.splitlines()[-1]
    for mapping in MAPPINGS:
        assert mapping in printed

    document = json.loads((out / "results.json").read_text())
    assert document["seeds"] == [0]
    results = document["per_seed"]["0"]
    assert list(results) == list(MAPPINGS)
    assert document["mean"]["tvmax"]["CIDEr"] == results["tvmax"]["CIDEr"]
    assert document["sd"]["tvmax"]["CIDEr"] is None  # undefined for one seed
    # The encoder was pretrained on the training split's cells; its report is kept.
    accuracy = document["encoder_val_cell_accuracy"]
    assert 0.0 <= accuracy["category_accuracy_on_objects"] <= 1.0
    assert "per-cell accuracy on the validation split" in printed
    assert (out / "metrics.png").is_file()
    assert f"gallery: {out / 'gallery' / 'index.html'}" in printed
    assert len(list((out / "gallery" / "images").glob("*.jpg"))) == QUICK.n_gallery
    for mapping, metrics in results.items():
        for key in ("Bleu_4", "METEOR", "ROUGE_L", "CIDEr", "REP"):
            assert math.isfinite(metrics[key]), (mapping, key)
        assert 0.0 <= metrics["zero_attention"] <= 1.0
        for key in ("attention_precision", "attention_precision_phrase"):
            assert math.isnan(metrics[key]) or 0.0 <= metrics[key] <= 1.0
        captioner = Captioner.load(out / f"{mapping}.ckpt")
        assert captioner.output_attention_name == mapping
    assert results["softmax"]["zero_attention"] == 0.0  # softmax is dense
    # Figures of the first test image for every model whose caption of it is not empty.
    first = json.loads((out / "captions_softmax.json").read_text())[0]["image_id"]
    for mapping in MAPPINGS:
        captions = json.loads((out / f"captions_{mapping}.json").read_text())
        caption = next(c["caption"] for c in captions if c["image_id"] == first)
        strips = list(out.glob(f"figures/*/{mapping}/strip.png"))
        assert len(strips) == (1 if caption else 0), mapping
        for strip in strips:
            words = sorted(strip.parent.glob("[0-9][0-9]_*.png"))
            assert len(words) == len(caption.split())

    # The default run's SPICE step (a quick run skips SPICE): one score per model, in [0, 1].
    dataset = SyntheticDataset.from_dir(dataset_dir(out, QUICK))
    captions = {
        mapping: {c["image_id"]: c["caption"] for c in
                  json.loads((out / f"captions_{mapping}.json").read_text())}
        for mapping in MAPPINGS
    }
    # Each model's run folder holds the exact config it trained with; fit retrains from it.
    assert resumed_demo.refit == 0
    assert (out / "runs" / "demo_tvmax" / "version_1" / "checkpoints" / "last.ckpt").is_file()

    spice = score_spice(load_test_split(dataset), captions)
    assert list(spice) == list(MAPPINGS)
    for corpus, per_image in spice.values():
        assert set(per_image) == set(captions["softmax"])
        assert math.isnan(corpus) or 0.0 <= corpus <= 1.0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--seed", "-1"], "seeds must be in [0, 4294967295], got -1"),
        # Lightning's seed_everything refused it in a traceback, after the data was made.
        (["--seeds", "0", "4294967296"], "seeds must be in [0, 4294967295], got 4294967296"),
        (["--lam-grid", "0.1", "0.1"], "--lam-grid gives 0.1 more than once"),
    ],
)
def test_seeds_and_lambdas_that_cannot_run_are_refused(tmp_path, capsys, options, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["--quick", *options, "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.endswith(f"error: {message}\n")
    assert not (tmp_path / "out").exists()


def test_repeated_seeds_are_refused_by_value(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--quick", "--seeds", "1", "2", "1", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.endswith("error: --seeds gives 1 more than once\n")


def test_an_out_that_cannot_be_a_folder_is_one_line_before_any_work(tmp_path, capsys):
    taken = tmp_path / "results.jsonl"
    taken.write_text("kept\n")
    assert main(["--quick", "--out", str(taken)]) == 2
    err = capsys.readouterr().err
    assert err == f"captioner demo: {taken}: exists and is not a folder\n"
    assert taken.read_text() == "kept\n" and sorted(tmp_path.iterdir()) == [taken]


def test_an_earlier_runs_results_are_neither_mixed_with_nor_replaced_unasked(tmp_path, capsys):
    from data_prep.output_folders import clear_folder
    from eval.demo.steps import earlier_results

    out = tmp_path / "demo"
    for folder in ("figures/img_1/softmax", "gallery", "runs/demo_tvmax/version_0",
                   "synthetic-64-6-6-128px-seed0"):
        (out / folder).mkdir(parents=True)
    for name in ("results.json", "metrics.png", "softmax.ckpt", "captions_softmax.json",
                 "figures/img_1/softmax/strip.png", "runs/demo_tvmax/version_0/config.yaml"):
        (out / name).write_text("earlier")
    (out / "trainings.json").write_text('{"trainings": []}')
    assert main(["--quick", "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"captioner demo: {out}: holds the results of an earlier demo run (captions_softmax.json, "
        "figures, gallery and 4 more); choose another --out, or pass --overwrite to replace "
        "them (data, encoder and feature cache made with the same settings are reused)\n")
    assert (out / "results.json").read_text() == "earlier"
    earlier = earlier_results(out)
    assert earlier == ["captions_softmax.json", "figures", "gallery", "metrics.png",
                       "results.json", "softmax.ckpt", "trainings.json"]
    clear_folder(out, earlier)  # what --overwrite does first
    assert sorted(p.name for p in out.iterdir()) == ["runs", "synthetic-64-6-6-128px-seed0"]
    assert (out / "runs/demo_tvmax/version_0/config.yaml").is_file()
    (out / "notes.txt").write_text("mine")
    assert main(["--quick", "--out", str(out), "--overwrite"]) == 2
    assert "holds files that are not the demo's (notes.txt)" in capsys.readouterr().err


def test_files_named_like_the_demos_without_its_record_are_the_users(tmp_path, capsys):
    """A model.ckpt, a captions_*.json or a figures/ folder of the user's was taken for an
    unfinished demo run's, and deleted: without trainings.json, which the demo writes before
    any of them, they are foreign."""
    out = tmp_path / "mine"
    (out / "figures").mkdir(parents=True)
    for name in ("my_best_model.ckpt", "captions_final.json", "figures/fig1.txt"):
        (out / name).write_text("precious")
    assert main(["--quick", "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"captioner demo: {out}: holds files that are not the demo's (captions_final.json, "
        "figures, my_best_model.ckpt); choose a new or empty folder\n")
    assert all((out / name).read_text() == "precious"
               for name in ("my_best_model.ckpt", "captions_final.json", "figures/fig1.txt"))


@pytest.mark.parametrize("note", ["gallery/notes.txt", "figures/img_1/softmax/notes.txt",
                                  "figures/img_1/mine.png"])
def test_overwrite_never_deletes_a_file_left_inside_the_demos_folders(note, tmp_path, capsys):
    """--overwrite removed gallery/ and figures/ whole, with a file of the user's inside."""
    out = tmp_path / "demo"
    (out / "figures/img_1/softmax").mkdir(parents=True)
    (out / "gallery").mkdir()
    for name in ("results.json", "metrics.png", "trainings.json",
                 "figures/img_1/softmax/00_a.png", "figures/img_1/softmax/strip.png"):
        (out / name).write_text("earlier")
    (out / note).write_text("mine")
    assert main(["--quick", "--out", str(out), "--overwrite"]) == 2
    assert capsys.readouterr().err == (
        f"captioner demo: {out}: holds files that are not the demo's inside its results "
        f"({note}); move them out, or choose a new or empty folder\n")
    assert (out / note).read_text() == "mine" and (out / "results.json").is_file()


def test_a_run_stopped_after_its_results_json_goes_on(tmp_path, capsys, monkeypatch):
    """results.json comes before SPICE, the figures and the gallery: a run stopped there was
    refused as finished, and --overwrite trained every captioner again."""
    from eval.demo import folder as command

    out = tmp_path / "demo"
    out.mkdir()
    (out / "results.json").write_text("{}")
    (out / "softmax.ckpt").write_text("a copy of a finished training's best checkpoint")
    (out / "trainings.json").write_text('{"trainings": []}')

    def stopped(folder, *args):
        assert sorted(p.name for p in folder.iterdir()) == [".demo.lock", "trainings.json"]
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "prepare_data", lambda folder, settings: None)
    monkeypatch.setattr(command, "run_demo", stopped)
    assert main(["--quick", "--out", str(out)]) == 130
    assert capsys.readouterr().out.startswith(f"going on with the unfinished demo run in {out}")


def _finished_run(out):
    """``out`` as a finished quick demo run leaves it, but for its data, made by the test."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ("results.json", "metrics.png"):
        (out / name).write_text("earlier")
    (out / "trainings.json").write_text('{"trainings": []}')


def test_a_damaged_dataset_file_is_named_before_earlier_results_are_cleared(tmp_path, capsys):
    # --overwrite cleared the earlier results first, then met the file: a traceback, and
    # results.json, the figures and the checkpoints gone.
    out = tmp_path / "demo"
    _finished_run(out)
    root = dataset_dir(out, QUICK)
    (root / "images").mkdir(parents=True)
    for name in ("dataset_synthetic.json", "instances_train.json", "instances_val.json",
                 "instances_test.json"):
        (root / name).write_text('{"images": [')
    assert main(["--quick", "--out", str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        f"captioner demo: {root / 'dataset_synthetic.json'}: not valid JSON"), err
    assert err.endswith(f"; remove {root} to make the demo's data again\n")
    assert (out / "results.json").read_text() == "earlier"


def test_an_encoder_file_that_cannot_be_read_is_made_again(tmp_path, capsys, monkeypatch):
    import captioner.features.pretraining as pretraining
    from data_prep.synthetic import generate
    from eval.demo.steps import encoder_path

    out = tmp_path / "demo"
    _finished_run(out)
    s = QUICK
    generate(dataset_dir(out, s), n_train=s.n_train, n_val=s.n_val, n_test=s.n_test,
             seed=s.seed, image_size=s.image_size, progress=False)
    weights = encoder_path(out, s)
    weights.write_bytes(b"PK\x03\x04 truncated")
    report = {**vars(s.pretraining), "seed": s.seed}
    weights.with_suffix(".json").write_text(json.dumps(report))

    def pretrain(*args, **kwargs):  # the remade encoder: stopped here, the test has seen enough
        raise KeyboardInterrupt

    monkeypatch.setattr(pretraining, "pretrain_encoder", pretrain)
    assert main(["--quick", "--out", str(out), "--overwrite"]) == 130
    assert f"the earlier run's encoder cannot be read (encoder weights file {weights}: " in (
        capsys.readouterr().out)
    assert (out / "results.json").read_text() == "earlier"


def test_a_second_demo_into_a_folder_in_use_is_one_line_and_touches_nothing(tmp_path, capsys):
    from data_prep.locks import hold_exclusively, let_go

    out = tmp_path / "demo"
    out.mkdir()
    (out / "softmax.ckpt").write_text("earlier")  # an unfinished run's, being trained on
    held = hold_exclusively(out / ".demo.lock")  # as the running demo holds it
    try:
        assert main(["--quick", "--out", str(out), "--overwrite"]) == 2
    finally:
        let_go(held)
    assert capsys.readouterr().err == (
        f"captioner demo: {out}: another captioner demo is running in this folder now (it "
        f"holds {out / '.demo.lock'}); wait for it to end, or choose another --out\n")
    assert sorted(p.name for p in out.iterdir()) == [".demo.lock", "softmax.ckpt"]


@pytest.mark.parametrize("lam", ["nan", "inf", "0"])
def test_a_lambda_grid_must_be_finite_and_positive(lam, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--quick", "--out", str(tmp_path / "demo"), "--lam-grid", "0.1", lam])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.endswith(
        f"--lam-grid values must be finite and positive, got {float(lam)}\n")


def test_ctrl_c_while_a_captioner_trains_stops_the_demo(monkeypatch, tmp_path):
    """Lightning ends an interrupted fit with exit(1): the demo stops as at Ctrl-C anywhere."""
    from types import SimpleNamespace

    import captioner.training.cli
    from eval.demo import steps as demo

    def interrupted(model, datamodule):
        raise SystemExit(1)

    trainer = SimpleNamespace(max_epochs=1, fit=interrupted, interrupted=True)
    parser = SimpleNamespace(dump=lambda config: "config")
    monkeypatch.setattr(captioner.training.cli, "build_cli",
                        lambda args, run: SimpleNamespace(trainer=trainer, model=None,
                                                          datamodule=None, parser=parser,
                                                          config=None))
    monkeypatch.setattr(demo, "fit_arguments", lambda *args: [])
    data = SimpleNamespace(encoder_sha256="0" * 64)
    with pytest.raises(KeyboardInterrupt):
        demo.train("tvmax", data, None, tmp_path, 0)
    trainer.interrupted = False
    with pytest.raises(SystemExit):
        demo.train("tvmax", data, None, tmp_path, 0)
    assert list(tmp_path.iterdir()) == []  # nothing recorded as finished


@pytest.mark.demo
@pytest.mark.java
@SHARED_RUN
def test_an_interrupted_demo_goes_on_without_training_its_finished_captioners_again(
        resumed_demo):
    out = resumed_demo.out
    assert resumed_demo.stopped.code == 130
    record = out / "trainings.json"
    assert resumed_demo.stopped.err.splitlines()[-1] == (
        f"captioner demo: interrupted; 2 captioners finished training ({record}): the same "
        "command goes on from there, --overwrite starts over")
    assert {"softmax.ckpt", "sparsemax.ckpt"} <= set(resumed_demo.stopped.checkpoints)

    assert resumed_demo.finished.code == 0
    printed = resumed_demo.finished.out
    assert f"going on with the unfinished demo run in {out}" in printed
    for mapping in ("softmax", "sparsemax"):
        assert f"== the {mapping} captioner, seed 0: trained already" in printed
        assert [p.name for p in (out / "runs" / f"demo_{mapping}").iterdir()] == ["version_0"]
    assert "training the tvmax captioner" in printed
    assert list(json.loads((out / "results.json").read_text())["per_seed"]["0"]) == list(
        MAPPINGS)
    assert len(json.loads(record.read_text())["trainings"]) == 3


def test_the_record_reuses_a_training_only_with_the_same_config_encoder_and_checkpoint(
        tmp_path):
    from eval.demo.trainings import Training, TrainingRecord

    checkpoint = tmp_path / "best.ckpt"
    checkpoint.write_bytes(b"weights")
    TrainingRecord(tmp_path).add(Training("model: {lam: 0.01}", "a" * 64, str(checkpoint), 1.5))
    record = TrainingRecord(tmp_path)  # read back from the file
    assert record.find("model: {lam: 0.01}", "a" * 64) == Training(
        "model: {lam: 0.01}", "a" * 64, str(checkpoint), 1.5)
    assert record.find("model: {lam: 0.1}", "a" * 64) is None
    assert record.find("model: {lam: 0.01}", "b" * 64) is None  # another encoder
    checkpoint.unlink()
    assert record.find("model: {lam: 0.01}", "a" * 64) is None


def test_a_moved_or_copied_folder_reuses_its_trainings(tmp_path):
    # The record held the folder's absolute paths (in the config, and the checkpoint's), so
    # a run moved elsewhere, said it went on, and trained every captioner again.
    import shutil

    from eval.demo.trainings import Training, TrainingRecord

    first, moved = tmp_path / "first", tmp_path / "moved"
    checkpoint = first / "runs" / "best.ckpt"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"weights")

    def config(out):
        return f"data:\n  feature_cache: {out / 'features.h5'}\n  image_size: 128\n"

    TrainingRecord(first).add(Training(config(first), "a" * 64, str(checkpoint), 1.5))
    shutil.copytree(first, moved)
    found = TrainingRecord(moved).find(config(moved), "a" * 64)
    assert found == Training(config(moved).replace(str(moved), "<OUT>"), "a" * 64,
                             str(moved / "runs" / "best.ckpt"), 1.5)
    assert TrainingRecord(moved).find(config(first), "a" * 64) is None  # the first's cache


@pytest.mark.parametrize("text", ["{", "[]", '{"trainings": [{"config": "x"}]}',
                                  '{"trainings": [{"config": "x", "encoder_sha256": "a", '
                                  '"checkpoint": "c", "val_CIDEr": NaN}]}'])
def test_a_damaged_record_of_an_unfinished_run_is_one_line_before_any_work(
        text, tmp_path, capsys):
    out = tmp_path / "demo"
    out.mkdir()
    (out / "softmax.ckpt").write_text("earlier")
    (out / "trainings.json").write_text(text)
    assert main(["--quick", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"captioner demo: {out / 'trainings.json'}: is not the demo's record "
                          "of finished trainings (")
    assert err.endswith("pass --overwrite to start the run over\n") and err.count("\n") == 1
    assert sorted(p.name for p in out.iterdir()) == ["softmax.ckpt", "trainings.json"]


@pytest.mark.demo
@pytest.mark.java
def test_quick_demo_over_seeds_with_lambda_chosen_on_validation(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["--quick", "--out", str(out), "--seeds", "3", "4", "--lam-grid", "0.1", "1"]) == 0
    printed = capsys.readouterr().out
    document = json.loads((out / "results.json").read_text())
    assert document["seeds"] == [3, 4] and list(document["per_seed"]) == ["3", "4"]
    assert [list(document["per_seed"][s]) for s in ("3", "4")] == [list(MAPPINGS)] * 2
    selection = document["lam_selection"]
    assert set(selection["val_CIDEr"]) == {"0.1", "1"}
    assert selection["val_CIDEr"][f"{selection['chosen']:g}"] == max(
        selection["val_CIDEr"].values())
    assert f"chosen {selection['chosen']:g}" in printed
    # The TVmax models of both seeds use the chosen lambda; the first seed's is the grid's.
    for seed, name in ((3, "tvmax.ckpt"), (4, "tvmax_seed4.ckpt")):
        hparams = Captioner.load(out / name).module.hparams
        assert hparams.output_attention_kwargs == {"lam": selection["chosen"]}, seed
    for mapping in MAPPINGS:
        cider = [document["per_seed"][s][mapping]["CIDEr"] for s in ("3", "4")]
        assert document["mean"][mapping]["CIDEr"] == pytest.approx(sum(cider) / 2)
        assert document["sd"][mapping]["CIDEr"] == pytest.approx(abs(cider[0] - cider[1]) / 2**0.5)
        assert (out / f"captions_{mapping}_seed4.json").is_file()
    assert "mean ± sd over seeds 3, 4" in printed and " ± " in printed


def test_a_run_given_overwrite_and_stopped_says_to_go_on_without_it(tmp_path):
    # "the same command goes on from there": with --overwrite, the same command started over.
    from eval.demo.folder import _interrupted

    (tmp_path / "trainings.json").write_text(json.dumps({"trainings": [
        {"config": "x", "encoder_sha256": "a", "checkpoint": "c.ckpt", "val_CIDEr": 0.5}]}))
    assert _interrupted(tmp_path, True) == (
        f"interrupted; 1 captioner finished training ({tmp_path / 'trainings.json'}): the same "
        "command without --overwrite goes on from there, --overwrite starts over")
