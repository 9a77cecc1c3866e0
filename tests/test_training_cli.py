"""`captioner fit|validate|test` (LightningCLI) and `captioner prepare-features` on tiny data:
named run folders, an exact resume, untrusted --ckpt_path files, one-line user errors and a
2-process DDP run on CPU (gloo)."""

from __future__ import annotations

import csv
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch.callbacks import Callback
from PIL import Image

from captioner.checkpointing import load_safely, save_atomically
from captioner.commands.lightning import main as lightning_main
from captioner.features.extraction import extract_features
from captioner.training.runs import read_progress
from data_prep.features import FeatureCache
from eval.demo.steps import ENCODER_LAYER as DEMO_LAYER

REPO = Path(__file__).resolve().parents[1]
MAPPINGS = ("softmax", "sparsemax", "tvmax")
PAPER_CONFIGS = [f"{data}_{mapping}" for data in ("coco", "flickr30k") for mapping in MAPPINGS]


def _image_size(dataset) -> int:
    """Side of the (square) synthetic images; the tiny models use it as their input size."""
    with Image.open(next(dataset.image_root.rglob("*.png"))) as image:
        return image.width



def _print_config(config: Path, capsys) -> dict:
    with pytest.raises(SystemExit) as exit_info:
        lightning_main(["fit", "--config", str(config), "--print_config"])
    assert exit_info.value.code in (None, 0)
    return yaml.safe_load(capsys.readouterr().out)


@pytest.mark.parametrize("name", PAPER_CONFIGS)
def test_paper_configs_parse_with_the_paper_settings(name, capsys):
    config = _print_config(REPO / "configs" / f"{name}.yaml", capsys)
    model, data = config["model"], config["data"]
    assert config["trainer"]["max_epochs"] == 50
    assert (model["encoder_arch"], model["encoder_weights"]) == ("resnet101", "IMAGENET1K_V2")
    assert (model["hidden_dim"], model["embed_dim"], model["feature_dim"]) == (512, 256, 512)
    assert (model["lr"], model["betas"]) == (1e-4, [0.8, 0.999])
    assert (model["lr_decay"], model["lr_decay_after"]) == (0.99, 10)
    assert model["input_attention"] == "softmax"
    assert model["output_attention"] == name.split("_")[1]
    if name.endswith("tvmax"):
        assert model["output_attention_kwargs"] == {"lam": 0.01}
    assert data["image_size"] == 256 and data["min_count"] == 5
    assert config["checkpoint"]["monitor"] == "val/CIDEr" and config["checkpoint"]["mode"] == "max"
    # Where the run goes (it said Lightning's "lightning_logs", and went to runs/NAME).
    assert config["trainer"]["logger"]["init_args"]["name"] == name


@pytest.mark.parametrize("mapping", MAPPINGS)
def test_demo_configs_read_what_the_default_demo_writes(mapping, capsys):
    """configs/demo_*.yaml train on the default demo's data (the demo itself trains with
    them, overriding only the paths of its own run)."""
    from eval.demo.steps import FULL, dataset_dir, encoder_path, feature_cache_path

    config = _print_config(REPO / "configs" / f"demo_{mapping}.yaml", capsys)
    root = dataset_dir(Path("demo_out"), FULL)
    cache = feature_cache_path(Path("demo_out"), FULL)
    assert config["data"]["karpathy_json"] == str(root / "dataset_synthetic.json")
    assert config["data"]["image_root"] == str(root / "images")
    assert config["data"]["feature_cache"] == str(cache)
    assert config["model"]["encoder_weights"] == str(encoder_path(Path("demo_out"), FULL))
    assert config["data"]["image_size"] == FULL.image_size
    assert config["model"]["output_attention"] == mapping
    assert config["model"]["decoding"]["beam_size"] == 3


@pytest.fixture(scope="module")
def tiny_cache(synthetic_data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("features") / "features_resnet18.h5"
    extract_features(
        synthetic_data.karpathy_json, synthetic_data.image_root, out, arch="resnet18",
        layer=DEMO_LAYER, weights=None, image_size=_image_size(synthetic_data), batch_size=8,
        num_workers=0, progress=False,
    )
    return out


def _call(capsys, *argv: str) -> tuple[int, str, str]:
    """``captioner ARGV`` in this process (the console script's main): (exit status, stdout,
    stderr), as :func:`_run` gives them where the process boundary is not what is tested."""
    from captioner.cli import main as cli_main

    capsys.readouterr()
    code = cli_main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_prepare_features_records_the_encoder(tiny_cache, synthetic_data):
    cache = FeatureCache(tiny_cache)
    assert cache.encoder["arch"] == "resnet18"
    assert cache.encoder["image_size"] == _image_size(synthetic_data)
    assert Path(cache.encoder["weights"]).is_file()  # random init saved for the model
    assert cache.encoder["layer"] == DEMO_LAYER
    assert cache.grid == (8, 8) and cache.channels == 256
    images = json.loads(synthetic_data.karpathy_json.read_text())["images"]
    assert len(cache) == len(images)
    assert cache.get(images[0]["cocoid"]).dtype.name == "float16"


def _cli_args(dataset, cache: Path, out: Path, *extra: str) -> list[str]:
    weights = FeatureCache(cache).encoder["weights"]
    return [
        "--config", str(REPO / "configs" / "demo_softmax.yaml"),
        "--data.karpathy_json", str(dataset.karpathy_json),
        "--data.image_root", str(dataset.image_root),
        "--data.feature_cache", str(cache),
        "--data.image_size", str(_image_size(dataset)),
        "--data.batch_size", "8",
        "--data.eval_batch_size", "4",
        "--model.encoder_weights", weights,
        "--model.hidden_dim", "32", "--model.feature_dim", "32", "--model.embed_dim", "16",
        "--model.dropout", "0.3",  # dropout draws random numbers: resume must restore them
        "--model.decoding.max_length", "8", "--model.decoding.beam_size", "2",
        "--trainer.limit_train_batches", "2",
        "--trainer.limit_val_batches", "1",
        "--trainer.enable_progress_bar", "false",
        "--trainer.logger.init_args.save_dir", str(out / "runs"),
        *extra,
    ]


def _run(*argv: str) -> tuple[int, str, str]:
    """``captioner ARGV`` in a subprocess: (exit status, stdout, stderr)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "captioner.cli", *argv], env=env,
                         capture_output=True, text=True, timeout=300)
    return run.returncode, run.stdout, run.stderr


def test_features_preloaded_on_the_device_train_the_weights_of_features_read_per_batch(
    synthetic_data, tiny_cache, tmp_path
):
    # The loaders then carry rows, swapped for the features after the transfer: validation too.
    weights = {}
    for preload in ("false", "device"):
        out = tmp_path / preload
        args = _cli_args(synthetic_data, tiny_cache, out, "--data.preload_features", preload)
        assert lightning_main(["fit", *args, "--trainer.max_epochs", "2"]) == 0
        run = out / "runs" / "demo_softmax" / "version_0"
        weights[preload] = load_safely(run / "checkpoints" / "last.ckpt")["state_dict"]
        metrics = list(csv.DictReader((run / "metrics.csv").open()))
        assert any(row.get("val/CIDEr") for row in metrics)
    saved = yaml.safe_load((tmp_path / "device" / "runs" / "demo_softmax" / "version_0"
                            / "config.yaml").read_text())
    assert saved["data"]["preload_features"] == "device"
    assert weights["false"].keys() == weights["device"].keys()
    assert all(torch.equal(weights["false"][k], weights["device"][k]) for k in weights["false"])


def test_features_too_large_for_the_device_stop_the_fit_in_one_line(
    synthetic_data, tiny_cache, tmp_path, capsys, monkeypatch
):
    import captioner.training.datamodule

    check = captioner.training.datamodule._check_device_memory
    # As on a GPU with 1 KiB free (the check reads the free memory of CUDA devices only).
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (1024, 2**30))
    monkeypatch.setattr(captioner.training.datamodule, "_check_device_memory",
                        lambda device, shape, path: check(torch.device("cuda:0"), shape, path))
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--data.preload_features", "device")
    assert lightning_main(["fit", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert re.fullmatch(
        rf"captioner fit: data.preload_features device: the features of \d+ images in "
        rf"{re.escape(str(tiny_cache))} need 0.0 GiB on cuda:0, which has 0.0 GiB free; use "
        r"data.preload_features true \(host memory\) or false", err), err


def test_an_unknown_preload_setting_is_refused_in_one_line(synthetic_data, tiny_cache, tmp_path,
                                                           capsys):
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--data.preload_features", "memory")
    assert lightning_main(["fit", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert "data.preload_features" in err and "memory" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--data.batch_size", "0", "data.batch_size must be an integer >= 1, got 0"),
    ("--data.num_workers", "-1", "data.num_workers must be an integer >= 0, got -1"),
    ("--model.lr", "-1", "model.lr must be a number >= 0, got -1.0"),
    ("--model.betas", "[0.9, 1.5]", "model.betas must be two numbers in [0, 1), got (0.9, 1.5)"),
    ("--model.gradient_clip_norm", "0", "model.gradient_clip_norm must be a number > 0, or "
     "null, got 0.0"),
    # Named as wrong in itself, not as a mismatch with the feature cache's image size.
    ("--data.image_size", "-5", "data.image_size must be an integer >= 1, got -5"),
])
def test_a_setting_that_cannot_train_is_named_before_training(option, value, message,
                                                              synthetic_data, tiny_cache,
                                                              tmp_path, capsys):
    # Torch refuses these too, but once the fit has begun, in words that name no option.
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, option, value)
    assert lightning_main(["fit", *args]) == 2
    assert capsys.readouterr().err == f"captioner fit: {message}\n"
    assert not (tmp_path / "runs").exists()


@pytest.mark.subprocess
def test_a_setting_refused_while_the_model_is_built_is_the_commands_one_line(
    synthetic_data, tiny_cache, tmp_path
):
    # In a process of its own, where Lightning's log reaches stderr: its "Seed set to 0" came
    # before every such refusal.
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--data.batch_size", "0")
    code, out, err = _run("fit", *args)
    assert (code, out, err) == (2, "", "captioner fit: data.batch_size must be an integer >= 1, "
                                "got 0\n")


@pytest.mark.parametrize("option", [["--optimizer", "torch.optim.SGD", "--optimizer.lr", "0.5"],
                                    ["--lr_scheduler", "torch.optim.lr_scheduler.ExponentialLR",
                                     "--lr_scheduler.gamma", "0.5"]])
def test_lightnings_optimizer_options_are_refused_not_put_in_the_models_place(
    option, synthetic_data, tiny_cache, tmp_path, capsys
):
    # They replaced the model's Adam and its decay, while the run's config.yaml still gave them.
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, *option)
    assert lightning_main(["fit", *args]) == 2
    assert capsys.readouterr().err == (
        f"captioner fit: {option[0]}: the optimizer and its schedule are the model's: set "
        "model.lr, model.betas, model.lr_decay and model.lr_decay_after\n")
    assert not (tmp_path / "runs").exists()
    # A run's config.yaml, which gives both null, trains.
    config = tmp_path / "config.yaml"
    config.write_text("optimizer: null\nlr_scheduler: null\n")
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--config", str(config),
                     "--trainer.max_epochs", "1")
    assert lightning_main(["fit", *args]) == 0


def test_a_printed_config_trains_where_it_says(synthetic_data, tiny_cache, tmp_path, capsys):
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--trainer.max_epochs", "1")
    with pytest.raises(SystemExit):
        lightning_main(["fit", *args, "--print_config"])
    printed = tmp_path / "printed.yaml"
    printed.write_text(capsys.readouterr().out)
    logger = yaml.safe_load(printed.read_text())["trainer"]["logger"]["init_args"]
    assert logger["name"] == "demo_softmax"
    assert lightning_main(["fit", "--config", str(printed)]) == 0
    assert (Path(logger["save_dir"]) / "demo_softmax" / "version_0" / "checkpoints"
            / "last.ckpt").is_file()


def test_a_min_count_that_leaves_no_word_is_refused_before_training(synthetic_data, tiny_cache,
                                                                    tmp_path, capsys):
    # Such a vocabulary holds only the special tokens: the fit ran, and every caption the
    # model wrote was empty.
    from data_prep.karpathy import load_karpathy

    train = load_karpathy(synthetic_data.karpathy_json, synthetic_data.image_root).split("train")
    most = max(Counter(word for entry in train for tokens in entry.sentences
                       for word in tokens).values())
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--data.min_count", str(most + 1))
    assert lightning_main(["fit", *args]) == 2
    assert capsys.readouterr().err == (
        f"captioner fit: data.min_count={most + 1} leaves no word in the vocabulary: the most "
        f"frequent word of the training captions of {synthetic_data.karpathy_json} occurs "
        f"{most} times; set data.min_count to at most {most}\n")
    assert not list(tmp_path.rglob("*.ckpt"))
    # At that count the most frequent word is kept and the fit trains.
    args = _cli_args(synthetic_data, tiny_cache, tmp_path / "kept", "--data.min_count", str(most),
                     "--trainer.max_epochs", "1")
    assert lightning_main(["fit", *args]) == 0


# With loader workers too: were they kept from epoch to epoch, an uninterrupted run would
# start them once and a resumed run again, drawing its shuffle and dropout masks elsewhere.
@pytest.mark.slow
@pytest.mark.parametrize("workers", ["0", "2"])
def test_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(
    synthetic_data, tiny_cache, tmp_path, workers, capsys
):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert lightning_main(["fit", *_cli_args(synthetic_data, tiny_cache, straight,
                                             "--data.num_workers", workers),
                           "--trainer.max_epochs", "3"]) == 0
    # "Killed" after epoch 2's checkpoint: the same config stopped there, then resumed.
    args = _cli_args(synthetic_data, tiny_cache, resumed, "--data.num_workers", workers)
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "2"]) == 0
    run = resumed / "runs" / "demo_softmax" / "version_0"
    assert load_safely(run / "checkpoints" / "last.ckpt")["global_step"] == 4
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "3", "--ckpt_path", "last"]) == 0

    assert sorted(p.name for p in (resumed / "runs" / "demo_softmax").iterdir()) == ["version_0"]
    a = load_safely(straight / "runs" / "demo_softmax" / "version_0" / "checkpoints" / "last.ckpt")
    b = load_safely(run / "checkpoints" / "last.ckpt")
    assert (a["epoch"], a["global_step"]) == (b["epoch"], b["global_step"]) == (2, 6)
    for name, tensor in a["state_dict"].items():
        assert torch.equal(tensor, b["state_dict"][name]), name
    assert a["lr_schedulers"] == b["lr_schedulers"]
    best = [s for k, s in b["callbacks"].items() if k.startswith("ModelCheckpoint")][0]
    assert Path(best["best_model_path"]).parent == run / "checkpoints"
    # The metrics of the first part are kept beside the resumed part's.
    assert (run / "metrics.part1.csv").is_file() and (run / "metrics.csv").is_file()
    progress = json.loads((run / "checkpoints" / "progress.json").read_text())
    assert (progress["epochs_done"], progress["global_step"]) == (3, 6)

    # The resumed run's own config.yaml with --ckpt_path last resumes it again, keeping the
    # metrics so far.
    part2 = (run / "metrics.csv").read_text()
    assert lightning_main(["fit", "--config", str(run / "config.yaml"), "--ckpt_path", "last",
                           "--trainer.max_epochs", "4"]) == 0
    assert (run / "metrics.part2.csv").read_text().splitlines()[1:] == \
        [row for row in part2.splitlines()[1:] if int(row.split(",")[1]) < 6]
    assert load_safely(run / "checkpoints" / "last.ckpt")["global_step"] == 8

    # A finished run is not "resumed" silently.
    code, _, err = _call(capsys, "fit", *args, "--trainer.max_epochs", "4", "--ckpt_path", "last")
    assert code == 2 and "has trained 4 epochs already" in err and "Traceback" not in err


@pytest.mark.slow
def test_a_fit_stopped_by_max_steps_inside_an_epoch_resumes_the_rest_of_it(
    synthetic_data, tiny_cache, tmp_path, capsys
):
    # Saved at the epoch's end, Lightning counted the epoch as done: progress.json said one
    # epoch done, and the resume skipped the epoch's other batches (2 epochs of 2 batches
    # ended at step 3, not 4).
    args = [*_cli_args(synthetic_data, tiny_cache, tmp_path), "--trainer.max_epochs", "2"]
    code, out, err = _call(capsys, "fit", *args, "--trainer.max_steps", "3")
    assert code == 0, err[-2000:]
    checkpoints = tmp_path / "runs" / "demo_softmax" / "version_0" / "checkpoints"
    assert f"last checkpoint: {checkpoints / 'last.ckpt'} (epochs done: 1, step 3)" in out
    progress = read_progress(checkpoints)
    assert (progress["epochs_done"], progress["global_step"]) == (1, 3)
    assert lightning_main(["fit", *args, "--ckpt_path", "last"]) == 0
    last = load_safely(checkpoints / "last.ckpt")
    assert (last["epoch"], last["global_step"]) == (1, 4)
    assert read_epochs_done(checkpoints.parent) == 2


@pytest.mark.subprocess
def test_a_fit_stopped_before_its_first_validation_does_not_blame_the_monitor(
        synthetic_data, tiny_cache, tmp_path):
    # No score to pick a best checkpoint by yet: Lightning warned as if the monitor were
    # misspelt ("could not find the monitored key ... Did you call log('val/CIDEr')?").
    args = [*_cli_args(synthetic_data, tiny_cache, tmp_path), "--trainer.max_epochs", "1"]
    code, _, err = _run("fit", *args, "--trainer.max_steps", "1")
    assert code == 0, err[-2000:]
    assert "could not find the monitored key" not in err


@pytest.mark.slow
def test_a_runs_own_config_with_ckpt_path_last_resumes_that_run(synthetic_data, tiny_cache,
                                                                tmp_path, capsys):
    # The saved config.yaml names the run through its logger, not through its own file name.
    # That run, even where a newer version of the same name exists.
    args = _cli_args(synthetic_data, tiny_cache, tmp_path)
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1"]) == 0
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1"]) == 0
    run, newer = (tmp_path / "runs" / "demo_softmax" / f"version_{n}" for n in (0, 1))
    # The config.yaml holds ckpt_path: null; given after --ckpt_path last, it would start a
    # third run from scratch.
    code, _, err = _call(capsys, "fit", "--ckpt_path", "last", "--config", str(run / "config.yaml"),
                        "--trainer.max_epochs", "2")
    assert code == 2 and err.strip() == (
        f"captioner fit: --ckpt_path comes before --config {run / 'config.yaml'}, which sets "
        "ckpt_path and would replace it; give the --config files first, then the options "
        "that change them")
    assert sorted(p.name for p in run.parent.iterdir()) == ["version_0", "version_1"]
    assert lightning_main(["fit", "--config", str(run / "config.yaml"),
                           "--trainer.max_epochs", "2", "--ckpt_path", "last"]) == 0
    assert sorted(p.name for p in run.parent.iterdir()) == ["version_0", "version_1"]
    assert load_safely(run / "checkpoints" / "last.ckpt")["global_step"] == 4
    assert load_safely(newer / "checkpoints" / "last.ckpt")["global_step"] == 2
    assert (newer / "metrics.csv").is_file() and not (newer / "metrics.part1.csv").exists()


def test_last_checkpoint_is_written_every_epoch_whatever_the_score(
    synthetic_data, tiny_cache, tmp_path
):
    # lr 0 keeps the weights, so validation CIDEr never improves after epoch 0: Lightning's own
    # save_last would leave last.ckpt at epoch 0.
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--model.lr", "0.0")
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "3"]) == 0
    checkpoints = tmp_path / "runs" / "demo_softmax" / "version_0" / "checkpoints"
    assert load_safely(checkpoints / "last.ckpt")["global_step"] == 6
    assert len(list(checkpoints.glob("best-*.ckpt"))) == 1


def test_only_last_holds_the_optimizer_state_and_a_fit_from_a_best_is_one_line(
    synthetic_data, tiny_cache, tmp_path, capsys
):
    args = _cli_args(synthetic_data, tiny_cache, tmp_path)
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1"]) == 0
    checkpoints = tmp_path / "runs" / "demo_softmax" / "version_0" / "checkpoints"
    last = load_safely(checkpoints / "last.ckpt")
    (best_path,) = checkpoints.glob("best-*.ckpt")
    best = load_safely(best_path)
    assert "optimizer_states" in last and "optimizer_states" not in best
    for key in ("state_dict", "callbacks", "loops", "global_step", "hyper_parameters"):
        assert key in best, key  # what test, caption and a resume's bookkeeping read
    torch.testing.assert_close(best["state_dict"], last["state_dict"])  # epoch 0 is the best
    # Adam keeps two moments per weight: without them a checkpoint is about a third.
    assert best_path.stat().st_size < 0.5 * (checkpoints / "last.ckpt").stat().st_size
    capsys.readouterr()
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "2",
                           "--ckpt_path", str(best_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "without the optimizer's state" in err, err
    assert "--ckpt_path last" in err


@pytest.mark.parametrize("given", ["command line", "config file"])
@pytest.mark.parametrize(("limit", "steps"), [("1", 1), ("1.0", 10)])
def test_an_int_batch_limit_counts_batches_and_a_float_is_a_fraction(
    given, limit, steps, synthetic_data, tiny_cache, tmp_path
):
    # Lightning types the limits float | int, and jsonargparse took the first type that holds
    # a value: 1 became 1.0, every batch. An epoch of 80 captions in batches of 8 is 10 steps.
    args = _cli_args(synthetic_data, tiny_cache, tmp_path)
    at = args.index("--trainer.limit_train_batches")
    del args[at:at + 2]
    if given == "command line":
        args += ["--trainer.limit_train_batches", limit]
    else:
        config = tmp_path / "limit.yaml"
        config.write_text(f"trainer:\n  limit_train_batches: {limit}\n")
        args[2:2] = ["--config", str(config)]
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1"]) == 0
    last = tmp_path / "runs" / "demo_softmax" / "version_0" / "checkpoints" / "last.ckpt"
    assert load_safely(last)["global_step"] == steps


def test_last_checkpoint_every_n_steps_when_asked(synthetic_data, tiny_cache, tmp_path,
                                                  monkeypatch):
    from captioner.training.runs import LastCheckpoint

    saved = []
    save = LastCheckpoint._save
    monkeypatch.setattr(LastCheckpoint, "_save",
                        lambda self, trainer, epoch_done: (saved.append(trainer.global_step),
                                                           save(self, trainer,
                                                                epoch_done=epoch_done)))
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--trainer.limit_train_batches", "3",
                     "--last.every_n_train_steps", "2")
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "2"]) == 0
    assert saved == [2, 3, 4, 6, 6]  # steps 2, 4, 6 and the end of each epoch (3, 6)
    progress = json.loads((tmp_path / "runs" / "demo_softmax" / "version_0" / "checkpoints" /
                           "progress.json").read_text())
    assert (progress["epochs_done"], progress["global_step"]) == (2, 6)


def test_a_stop_after_last_ckpt_is_written_still_records_its_progress(
        synthetic_data, tiny_cache, tmp_path, monkeypatch, capsys):
    # Under DDP the save ends at a barrier, which fails when another process is lost after the
    # file was written: progress.json and the resume line named the epoch before.
    import signal

    from captioner.training.trainer import Trainer

    save = Trainer.save_checkpoint

    def stopped_after_the_second_last_ckpt(self, path, *args, **kwargs):
        save(self, path, *args, **kwargs)
        if Path(path).name == "last.ckpt" and self.current_epoch == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "save_checkpoint", stopped_after_the_second_last_ckpt)
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--trainer.max_epochs", "3")
    handler = signal.getsignal(signal.SIGINT)  # Lightning ignores Ctrl-C while it stops
    try:
        assert lightning_main(["fit", *args]) == 130
    finally:
        signal.signal(signal.SIGINT, handler)
    run = tmp_path / "runs" / "demo_softmax" / "version_0"
    assert load_safely(run / "checkpoints" / "last.ckpt")["epoch"] == 1
    assert read_epochs_done(run) == 2
    assert capsys.readouterr().err.strip().endswith(
        f"resumes from {run / 'checkpoints' / 'last.ckpt'} (epochs done: 2)")


@pytest.mark.subprocess
def test_fit_prints_the_run_folder_and_checkpoints_and_runs_lists_them(
    synthetic_data, tiny_cache, tmp_path, capsys
):
    # A child process: what the console shows (Lightning's log lines too) is what is tested.
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--run_name", "tiny")
    code, out, err = _run("fit", *args, "--trainer.max_epochs", "1")
    assert code == 0, err[-2000:]
    run = tmp_path / "runs" / "tiny" / "version_0"
    assert f"run folder: {run}" in out
    best = next((run / "checkpoints").glob("best-*.ckpt"))
    assert f"best checkpoint: {best}" in out
    assert f"last checkpoint: {run / 'checkpoints' / 'last.ckpt'}" in out
    assert "Tip:" not in out + err and "module(s) in eval mode at the start" not in err
    assert "Seed set to 0" in out + err  # told once the model and the data stand

    code, out, err = _call(capsys, "runs", "--root", str(tmp_path / "runs"))
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.startswith("tiny"))
    assert "version_0" in row and str(best) in row and " 1/1 " in row  # of its max_epochs
    assert " softmax/softmax " in row  # configs/demo_softmax.yaml's attention
    # A moved runs folder: its checkpoints where they are now, not where they were written.
    moved = tmp_path / "moved"
    (tmp_path / "runs").rename(moved)
    code, out, err = _call(capsys, "runs", "--root", str(moved))
    row = next(line for line in out.splitlines() if line.startswith("tiny"))
    here = moved / "tiny" / "version_0" / "checkpoints"
    assert f"best {here / best.name}  last {here / 'last.ckpt'}" in row, row
    # A copy whose file is gone: that file marked missing, not the original's listed.
    shutil.copytree(moved, tmp_path / "copy")
    (tmp_path / "copy" / "tiny" / "version_0" / "checkpoints" / "last.ckpt").unlink()
    code, out, err = _call(capsys, "runs", "--root", str(tmp_path / "copy"))
    row = next(line for line in out.splitlines() if line.startswith("tiny"))
    copied = tmp_path / "copy" / "tiny" / "version_0" / "checkpoints"
    assert f"best {copied / best.name}  last {copied / 'last.ckpt'} (missing)" in row, row


@pytest.mark.subprocess
def test_validate_and_test_take_a_cli_checkpoint_and_best(synthetic_data, tiny_cache, tmp_path,
                                                           monkeypatch, capsys):
    args = _cli_args(synthetic_data, tiny_cache, tmp_path)
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1"]) == 0
    best = next((tmp_path / "runs" / "demo_softmax" / "version_0" / "checkpoints").glob("best*"))
    monkeypatch.chdir(best.parent)
    assert lightning_main(["validate", *args, "--ckpt_path", best.name]) == 0
    monkeypatch.chdir(tmp_path)
    # A child process: the absence of Lightning's warning on stderr is tested.
    code, out, err = _run("test", *args, "--ckpt_path", "best")
    assert code == 0, err[-2000:]
    assert "dirpath has changed" not in err  # Lightning's warning, of no use to a test
    run = tmp_path / "runs" / "demo_softmax" / "version_0"
    assert f"scores logged in {run / 'test' / 'metrics.csv'}" in out
    assert sorted(p.name for p in run.parent.iterdir()) == ["version_0"]  # no new versions
    validated = list(csv.DictReader((run / "validate" / "metrics.csv").open()))
    # The run's config names the checkpoint it scored from any folder, not from the one the
    # command ran in.
    assert yaml.safe_load((run / "validate" / "config.yaml").read_text())["ckpt_path"] == str(
        best)
    tested = list(csv.DictReader((run / "test" / "metrics.csv").open()))
    assert validated[0]["val/CIDEr"] and tested[0]["test/CIDEr"]
    # A second test of the run keeps the first one's results.
    assert lightning_main(["test", *args, "--ckpt_path", "last",
                           "--model.decoding.beam_size", "1"]) == 0
    assert list(csv.DictReader((run / "test" / "metrics.csv").open())) == tested
    assert list(csv.DictReader((run / "test_2" / "metrics.csv").open()))[0]["test/CIDEr"]
    saved = yaml.safe_load((run / "test_2" / "config.yaml").read_text())
    assert saved["ckpt_path"].endswith("last.ckpt")
    # It records the folder it is in, which a logger given this config writes into.
    assert saved["trainer"]["logger"]["init_args"]["version"] == "version_0/test_2"


def test_an_evaluation_logging_in_a_run_sends_another_one_beside_it(synthetic_data, tiny_cache,
                                                                    tmp_path, monkeypatch):
    """Two tests of one run's checkpoint started together write into two folders."""
    from data_prep.locks import hold_exclusively, let_go

    args = _cli_args(synthetic_data, tiny_cache, tmp_path)
    monkeypatch.chdir(tmp_path)
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1"]) == 0
    run = tmp_path / "runs" / "demo_softmax" / "version_0"
    (run / "test").mkdir()
    running = hold_exclusively(run / "test")  # another `captioner test` of the run, scoring
    try:
        assert lightning_main(["test", *args, "--ckpt_path", "best"]) == 0
    finally:
        let_go(running)
    assert not any((run / "test").iterdir())
    assert list(csv.DictReader((run / "test_2" / "metrics.csv").open()))[0]["test/CIDEr"]
    # The command let go of its folder when it ended.
    held = hold_exclusively(run / "test_2")
    assert held is not None
    let_go(held)
    # The other test ended without scores, its folder left empty: the next test takes it.
    assert lightning_main(["test", *args, "--ckpt_path", "best"]) == 0
    assert list(csv.DictReader((run / "test" / "metrics.csv").open()))[0]["test/CIDEr"]
    assert sorted(p.name for p in run.iterdir() if p.name.startswith("test")) == [
        "test", "test_2"]


def test_an_evaluation_folder_is_the_first_with_no_scores_that_nobody_holds(tmp_path):
    from captioner.training.runs import claim_evaluation_folder
    from data_prep.locks import hold_exclusively, let_go

    (tmp_path / "validate").mkdir()
    (tmp_path / "validate" / "metrics.csv").write_text("val/CIDEr\n0.5\n")
    (tmp_path / "validate_3").mkdir()  # left empty by an evaluation that failed
    (tmp_path / "validate_2").mkdir()
    other = hold_exclusively(tmp_path / "validate_2")
    try:
        name, hold = claim_evaluation_folder(tmp_path, "validate")
        assert name == "validate_3" and hold is not None
        # Held now: the next one goes on to validate_4, which it makes.
        name_next, hold_next = claim_evaluation_folder(tmp_path, "validate")
        assert name_next == "validate_4" and (tmp_path / "validate_4").is_dir()
        let_go(hold_next)
        let_go(hold)
    finally:
        let_go(other)
    name, hold = claim_evaluation_folder(tmp_path, "validate")
    assert name == "validate_2"
    let_go(hold)


@pytest.mark.slow
def test_runs_says_a_version_holds_the_test_of_a_checkpoint_from_elsewhere(
    synthetic_data, tiny_cache, tmp_path, capsys
):
    trained = _cli_args(synthetic_data, tiny_cache, tmp_path / "trained")
    assert lightning_main(["fit", *trained, "--trainer.max_epochs", "1"]) == 0
    model = tmp_path / "models" / "softmax.ckpt"  # as the demo leaves its models
    model.parent.mkdir()
    shutil.copy(tmp_path / "trained" / "runs" / "demo_softmax" / "version_0" / "checkpoints" /
                "last.ckpt", model)
    args = _cli_args(synthetic_data, tiny_cache, tmp_path / "scored")
    code, _, err = _call(capsys, "test", *args, "--ckpt_path", str(model))
    assert code == 0, err[-2000:]
    code, out, err = _call(capsys, "runs", "--root", str(tmp_path / "scored" / "runs"))
    assert code == 0, err
    run = tmp_path / "scored" / "runs" / "demo_softmax" / "version_0"
    assert out.splitlines()[1] == (
        f"demo_softmax             version_0  softmax/softmax       -        - -     (no "
        f"training: test of {model}, scores in {run / 'metrics.csv'})")
    # A training run that has not saved a checkpoint yet is not taken for one.
    (run.parent / "version_1").mkdir()
    (run.parent / "version_1" / "config.yaml").write_text("ckpt_path: null\n")
    code, out, err = _call(capsys, "runs", "--root", str(tmp_path / "scored" / "runs"))
    assert out.splitlines()[2].endswith(
        f"version_1  {'?':<16}      -        - -     (stopped before its first checkpoint: "
        "nothing to resume)")


def test_ckpt_path_help_says_what_captioner_does(capsys):
    with pytest.raises(SystemExit):
        lightning_main(["fit", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "the newest runs/NAME/version_N with a last.ckpt" in help_text


def test_best_of_no_run_says_best(synthetic_data, tiny_cache, tmp_path, capsys):
    args = _cli_args(synthetic_data, tiny_cache, tmp_path)
    assert lightning_main(["validate", *args, "--ckpt_path", "best"]) == 2
    assert capsys.readouterr().err == (
        "captioner validate: --ckpt_path best: no version_N run of 'demo_softmax' has a best "
        f"checkpoint (nor a last.ckpt) under {tmp_path / 'runs' / 'demo_softmax'}; train first "
        "(without --ckpt_path) or give a checkpoint file\n")
    # A named version is only read when named: the message says that one exists.
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1",
                           "--trainer.logger.init_args.version", "mine"]) == 0
    capsys.readouterr()
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "2", "--ckpt_path",
                           "last"]) == 2
    assert capsys.readouterr().err == (
        "captioner fit: --ckpt_path last: no version_N run of 'demo_softmax' has a last.ckpt "
        f"under {tmp_path / 'runs' / 'demo_softmax'}; versions named with "
        "--trainer.logger.init_args.version have one (mine): name the one meant\n")


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--ckpt_path", "last"], "no version_N run of 'demo_softmax' has a last.ckpt"),
        (["--ckpt_path", "nowhere.ckpt"], "nowhere.ckpt: no such checkpoint file"),
        (["--data.karpathy_json", "missing.json"], "missing.json"),
        (["--model.output_attention", "nosuchmax"], "nosuchmax"),
        (["--model.output_attention", "tvmax", "--model.output_attention_kwargs",
          "{lam: -1}"], "lam"),
        (["--model.output_attention", "tvmax", "--model.output_attention_kwargs",
          "{lam: abc}"], "lam must be a float"),
        (["--model.output_attention", "tvmax", "--model.output_attention_kwargs",
          "{lamm: 0.1}"], "unexpected keyword(s) lamm"),
        (["--model.hiden_dim", "3"], "hiden_dim"),
        (["--config", "nope.yaml"], "nope.yaml"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(synthetic_data, tiny_cache, tmp_path, extra,
                                             message):
    args = _cli_args(synthetic_data, tiny_cache, tmp_path)
    code, out, err = _run("fit", *args, "--trainer.max_epochs", "1", *extra)
    assert code == 2, err[-2000:]
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("captioner fit: ")]
    assert len(errors) == 1 and message in errors[0], err
    assert not list(tmp_path.glob("runs/*/version_*"))  # no empty run folder left behind


@pytest.mark.slow
def test_a_refused_resume_leaves_the_run_as_it_was(synthetic_data, tiny_cache, tmp_path, capsys):
    # The checkpoint is read before anything of the run is rewritten: a resume refused for
    # another vocabulary keeps the run's config.yaml and metrics.csv.
    args = _cli_args(synthetic_data, tiny_cache, tmp_path)
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1"]) == 0
    run = tmp_path / "runs" / "demo_softmax" / "version_0"
    before = {name: (run / name).read_bytes() for name in ("config.yaml", "metrics.csv")}
    code, _, err = _call(capsys, "fit", "--config", str(run / "config.yaml"), "--ckpt_path", "last",
                        "--trainer.max_epochs", "2", "--data.min_count", "50")
    assert code == 2 and "vocabulary differs" in err, err[-2000:]
    assert {name: (run / name).read_bytes() for name in before} == before
    assert not list(run.glob("metrics.part*.csv"))
    assert sorted(p.name for p in run.parent.iterdir()) == ["version_0"]


@pytest.mark.slow
@pytest.mark.parametrize("command", ["fit", "test"])
def test_a_checkpoint_whose_weights_do_not_fit_is_one_line(synthetic_data, tiny_cache, tmp_path,
                                                           command, capsys):
    # Hyperparameters that build a model, weights that do not fit it (a tensor missing): the
    # refusal names the file and the tensor, and the run it came from is left as it was.
    args = _cli_args(synthetic_data, tiny_cache, tmp_path)
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1"]) == 0
    run = tmp_path / "runs" / "demo_softmax" / "version_0"
    checkpoint = load_safely(run / "checkpoints" / "last.ckpt")
    dropped = next(iter(checkpoint["state_dict"]))
    del checkpoint["state_dict"][dropped]
    damaged = tmp_path / "damaged.ckpt"
    save_atomically(checkpoint, damaged)
    before = {path: path.read_bytes() for path in run.rglob("*") if path.is_file()}

    code, _, err = _call(capsys, command, "--config", str(run / "config.yaml"), "--ckpt_path",
                        str(damaged), "--trainer.max_epochs", "2")
    assert code == 2 and "Traceback" not in err, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith(f"captioner {command}: ")]
    assert len(errors) == 1, err[-3000:]
    assert f"{damaged}: the checkpoint's weights do not fit" in errors[0], errors[0]
    assert f"1 tensor missing from the checkpoint ({dropped})" in errors[0], errors[0]
    assert {path: path.read_bytes() for path in run.rglob("*") if path.is_file()} == before
    assert sorted(p.name for p in run.parent.iterdir()) == ["version_0"]


@pytest.mark.subprocess
@pytest.mark.parametrize("edit, extra, message", [
    # Lightning restored it, trained nothing and ended as a fit does, with status 0, leaving a
    # new run folder without checkpoints.
    (None, ["--trainer.max_epochs", "1"],
     "it has trained 1 epoch already, and --trainer.max_epochs is 1; give a larger"),
    (None, ["--trainer.max_epochs", "3", "--trainer.max_steps", "2"],
     "it has trained 2 steps already, and --trainer.max_steps is 2; give a larger"),
    # caption refused it; fit trained on with the data's vocabulary size.
    ({"vocab_size": 500}, ["--trainer.max_epochs", "2"], "but vocab_size is 500"),
])
def test_fit_refuses_a_checkpoint_file_caption_refuses_or_that_has_nothing_left_to_train(
        synthetic_data, tiny_cache, tmp_path, edit, extra, message, capsys):
    args = _cli_args(synthetic_data, tiny_cache, tmp_path)
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1"]) == 0
    checkpoint = load_safely(tmp_path / "runs" / "demo_softmax" / "version_0" / "checkpoints"
                             / "last.ckpt")
    checkpoint["hyper_parameters"].update(edit or {})
    given = tmp_path / "given.ckpt"
    save_atomically(checkpoint, given)
    code, _, err = _call(capsys, "fit", *args, "--run_name", "again", "--ckpt_path", str(given),
                         *extra)
    assert code == 2 and "Traceback" not in err, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("captioner fit: ")]
    assert len(errors) == 1 and str(given) in errors[0], err[-3000:]
    assert message in errors[0], errors[0]
    assert not (tmp_path / "runs" / "again").exists()


@pytest.mark.slow
def test_a_beam_validation_cannot_fit_in_memory_is_refused_before_training(
        synthetic_data, tiny_cache, tmp_path, capsys):
    # It trained the epoch, then failed at validation's first beam search with no checkpoint.
    args = _cli_args(synthetic_data, tiny_cache, tmp_path)
    code, out, err = _call(capsys, "fit", *args, "--trainer.max_epochs", "1",
                          "--model.decoding.beam_size", str(10**10))
    assert code == 1 and "Traceback" not in err, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("captioner fit: ")]
    assert len(errors) == 1 and re.fullmatch(
        r"captioner fit: out of memory \(validation: a beam search of 10,000,000,000 beams x "
        r"\d+ images needs .* GiB is free \(--data.eval_batch_size and "
        r"--model.decoding.beam_size\)\); .*", errors[0]), errors
    assert "Epoch 0" not in err + out
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_a_refused_test_of_a_runs_checkpoint_leaves_no_test_folder(synthetic_data, tiny_cache,
                                                                   tmp_path, capsys):
    # A test that never scored leaves no version_N/test/ (its config.yaml naming the
    # checkpoint) behind: the next test of the run logs there as the first.
    args = _cli_args(synthetic_data, tiny_cache, tmp_path)
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1"]) == 0
    run = tmp_path / "runs" / "demo_softmax" / "version_0"
    before = sorted(path.name for path in run.iterdir())
    code, _, err = _call(capsys, "test", "--config", str(run / "config.yaml"),
                         "--ckpt_path", "best", "--data.min_count", "50")
    assert code == 2 and "vocabulary differs" in err, err[-3000:]
    assert sorted(path.name for path in run.iterdir()) == before
    assert lightning_main(["test", "--config", str(run / "config.yaml"),
                           "--ckpt_path", "best"]) == 0
    assert (run / "test" / "metrics.csv").is_file()


def test_a_resumed_runs_config_trains_its_recipe_anew(synthetic_data, tiny_cache, tmp_path,
                                                     capsys):
    """A run's config.yaml is its recipe: after a resume it records neither the checkpoint nor
    the version the resume continued, so that a fit of it under another name starts from
    scratch rather than from that checkpoint."""
    args = _cli_args(synthetic_data, tiny_cache, tmp_path)
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1"]) == 0
    run = tmp_path / "runs" / "demo_softmax" / "version_0"
    assert lightning_main(["fit", "--config", str(run / "config.yaml"), "--ckpt_path", "last",
                           "--trainer.max_epochs", "2"]) == 0
    recipe = yaml.safe_load((run / "config.yaml").read_text())
    assert recipe["ckpt_path"] is None
    assert recipe["trainer"]["logger"]["init_args"]["version"] is None
    steps = read_progress(run / "checkpoints")["global_step"]
    capsys.readouterr()
    assert lightning_main(["fit", "--config", str(run / "config.yaml"), "--run_name", "fresh",
                           "--trainer.max_epochs", "1"]) == 0
    fresh = read_progress(tmp_path / "runs" / "fresh" / "version_0" / "checkpoints")
    assert (fresh["epochs_done"], fresh["global_step"]) == (1, steps // 2)
    assert "Warning" not in capsys.readouterr().err


def test_a_version_not_made_yet_starts_from_a_given_checkpoint_in_a_folder_of_its_own(
        synthetic_data, tiny_cache, tmp_path, capsys):
    args = _cli_args(synthetic_data, tiny_cache, tmp_path)
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1"]) == 0
    last = tmp_path / "runs" / "demo_softmax" / "version_0" / "checkpoints" / "last.ckpt"
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, _, err = _call(capsys, "fit", *args, "--run_name", "warm",
                             "--trainer.logger.init_args.version", "0", "--ckpt_path", str(last),
                             "--trainer.max_epochs", "2")
    assert code == 0, err
    # Not taken for a resume of a run whose folder is missing (which no lock could hold).
    assert not [w for w in caught if "would not be refused" in str(w.message)]
    warm = tmp_path / "runs" / "warm" / "version_0"
    assert warm.is_dir() and read_progress(warm / "checkpoints")["epochs_done"] == 2


@pytest.mark.parametrize("command", ["validate", "test"])
def test_an_outside_checkpoint_scored_with_a_runs_config_leaves_that_run_alone(
        synthetic_data, tiny_cache, tmp_path, command):
    """validate / test of a checkpoint from outside the runs with a resumed run's config.yaml
    (which once pinned the run's version) never log into that run, replacing its config.yaml,
    hparams.yaml and metrics.csv with the test's."""
    args = _cli_args(synthetic_data, tiny_cache, tmp_path)
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1"]) == 0
    run = tmp_path / "runs" / "demo_softmax" / "version_0"
    outside = tmp_path / "outside.ckpt"
    shutil.copy(run / "checkpoints" / "last.ckpt", outside)
    assert lightning_main(["fit", "--config", str(run / "config.yaml"), "--ckpt_path", "last",
                           "--trainer.max_epochs", "2"]) == 0
    before = {path: path.read_bytes() for path in run.rglob("*") if path.is_file()}
    assert lightning_main([command, "--config", str(run / "config.yaml"),
                           "--ckpt_path", str(outside)]) == 0
    assert {path: path.read_bytes() for path in run.rglob("*") if path.is_file()} == before
    scored = yaml.safe_load((run.parent / "version_1" / "config.yaml").read_text())
    assert scored["ckpt_path"] == str(outside)
    logged = {"validate": "val/CIDEr", "test": "test/CIDEr"}[command]
    assert logged in (run.parent / "version_1" / "metrics.csv").read_text()


def test_ctrl_c_in_a_test_leaves_no_unscored_run_folder(synthetic_data, tiny_cache, tmp_path,
                                                         capsys, monkeypatch):
    # A test of a checkpoint from outside the runs logs into a new version_N; stopped before
    # its scores, that folder held only config.yaml, listed by `captioner runs` as a run with
    # no checkpoint yet.
    import signal

    from captioner.training.module import CaptioningModule

    args = _cli_args(synthetic_data, tiny_cache, tmp_path)
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1"]) == 0
    outside = tmp_path / "outside.ckpt"
    shutil.copy(tmp_path / "runs" / "demo_softmax" / "version_0" / "checkpoints" / "last.ckpt",
                outside)

    def interrupted(self, batch, batch_idx):
        raise KeyboardInterrupt

    monkeypatch.setattr(CaptioningModule, "test_step", interrupted)
    handler = signal.getsignal(signal.SIGINT)  # Lightning ignores Ctrl-C while it shuts down
    try:
        code = lightning_main(["test", *args, "--ckpt_path", str(outside)])
    finally:
        signal.signal(signal.SIGINT, handler)
    assert code == 130
    assert "captioner test: interrupted" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "runs" / "demo_softmax").iterdir()) == ["version_0"]


# Both fail after the run's config.yaml and hparams.yaml are written (on_fit_start) and before
# training starts: in the sanity check, and in making the training loader after it (each a
# loader that cannot be made: the data module's settings are all checked before the fit).
STOPPED_BEFORE_TRAINING = {
    "sanity check": ("val_dataloader", ("--trainer.num_sanity_val_steps", "1")),
    "training loader": ("train_dataloader", ()),
}


def _stop_before_training(monkeypatch, where: str) -> tuple[str, ...]:
    """Make the loader of ``where`` (a key of STOPPED_BEFORE_TRAINING) fail; the options that
    reach it."""
    from captioner.training.datamodule import CaptionDataModule

    hook, options = STOPPED_BEFORE_TRAINING[where]

    def fail(self):
        raise ValueError("the loader could not be made")

    monkeypatch.setattr(CaptionDataModule, hook, fail)
    return options


@pytest.mark.parametrize("where", STOPPED_BEFORE_TRAINING)
def test_a_new_run_stopped_before_training_leaves_no_run_folder(synthetic_data, tiny_cache,
                                                                tmp_path, where, monkeypatch,
                                                                capsys):
    options = _stop_before_training(monkeypatch, where)
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--run_name", "err3")
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1", *options]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("captioner fit: ")]
    assert errors == ["captioner fit: the loader could not be made"], err
    assert not (tmp_path / "runs").exists()  # nothing for `captioner runs` to list


def test_a_new_run_whose_first_batch_is_unreadable_leaves_no_run_folder(synthetic_data,
                                                                       tiny_cache, tmp_path,
                                                                       capsys):
    # A damaged cache is found as the first batch is read, after the run folder was made.
    import h5py

    damaged = tmp_path / tiny_cache.name
    shutil.copy(tiny_cache, damaged)
    with h5py.File(damaged, "r+") as file:
        file["features"][...] = float("inf")
    args = _cli_args(synthetic_data, damaged, tmp_path, "--run_name", "damaged")
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1"]) == 2
    assert "holds NaN or inf" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_a_new_run_stopped_before_training_keeps_the_earlier_versions(synthetic_data,
                                                                     tiny_cache, tmp_path,
                                                                     monkeypatch):
    args = _cli_args(synthetic_data, tiny_cache, tmp_path)
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1"]) == 0
    runs = tmp_path / "runs" / "demo_softmax"
    before = {path: path.read_bytes() for path in runs.rglob("*") if path.is_file()}
    options = _stop_before_training(monkeypatch, "sanity check")
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1", *options]) == 2
    assert {path: path.read_bytes() for path in runs.rglob("*") if path.is_file()} == before
    assert sorted(p.name for p in runs.iterdir()) == ["version_0"]


def test_runs_started_together_each_get_their_own_version_folder(synthetic_data, tiny_cache,
                                                                  tmp_path):
    # Two fits of one name (two seeds) started at the same moment: the second picks its
    # version before the first has made its folder. Lightning's logger would give both
    # version_0, and they would write their checkpoints and metrics into one folder.
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--trainer.max_epochs", "1")
    from captioner.training.cli import build_cli

    first = build_cli([*args, "--seed_everything", "1"], run=False)
    second = build_cli([*args, "--seed_everything", "2"], run=False)
    first.before_fit()
    second.before_fit()
    folders = [Path(cli.trainer.logger.log_dir) for cli in (first, second)]
    assert [folder.name for folder in folders] == ["version_0", "version_1"]
    assert all(folder.is_dir() for folder in folders)
    for cli in (first, second):  # what the end of the command does: let go of the runs
        cli._run_lock.release()


@pytest.mark.subprocess
def test_a_run_being_trained_is_not_resumed_by_another_fit(synthetic_data, tiny_cache,
                                                           tmp_path):
    # A fit holds its run folder (flock) while it trains: `fit --ckpt_path last` of the same
    # name, which picks the newest run with a last.ckpt, would train into it too.
    args = _cli_args(synthetic_data, tiny_cache, tmp_path)
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1"]) == 0
    run = tmp_path / "runs" / "demo_softmax" / "version_0"
    before = {path: path.read_bytes() for path in run.rglob("*") if path.is_file()}
    training = os.open(run, os.O_RDONLY)
    fcntl.flock(training, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as the fit training in it does
    code, _, err = _run("fit", *args, "--ckpt_path", "last", "--trainer.max_epochs", "2")
    assert code == 2 and "Traceback" not in err, err[-2000:]
    errors = [line for line in err.splitlines() if line.startswith("captioner fit: ")]
    assert len(errors) == 1 and str(run) in errors[0] and "another fit" in errors[0], err
    assert {path: path.read_bytes() for path in run.rglob("*") if path.is_file()} == before
    os.close(training)  # the fit ended (or was killed): the run resumes
    assert lightning_main(["fit", *args, "--ckpt_path", "last",
                           "--trainer.max_epochs", "2"]) == 0
    assert read_epochs_done(run) == 2


def test_an_interrupted_fit_lets_go_of_its_run(synthetic_data, tiny_cache, tmp_path,
                                              monkeypatch, capsys):
    # Lightning calls no teardown hook when a fit stops on an exception (Ctrl-C among them):
    # the run stayed held until the process ended, and a resume in the same process was
    # refused as if another fit were training in it.
    import signal

    from captioner.training.module import CaptioningModule

    args = _cli_args(synthetic_data, tiny_cache, tmp_path)
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1"]) == 0
    run = tmp_path / "runs" / "demo_softmax" / "version_0"

    def interrupted(self, batch, batch_idx):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(CaptioningModule, "training_step", interrupted)
        handler = signal.getsignal(signal.SIGINT)  # Lightning ignores Ctrl-C while it stops
        try:
            assert lightning_main(["fit", *args, "--ckpt_path", "last",
                                   "--trainer.max_epochs", "2"]) == 130
        finally:
            signal.signal(signal.SIGINT, handler)
    capsys.readouterr()
    assert lightning_main(["fit", *args, "--ckpt_path", "last",
                           "--trainer.max_epochs", "2"]) == 0, capsys.readouterr().err
    assert read_epochs_done(run) == 2


def test_a_fit_holds_a_version_named_on_its_command_line(synthetic_data, tiny_cache, tmp_path,
                                                         capsys):
    from captioner.training.runs import RunLock

    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--trainer.max_epochs", "1",
                     "--trainer.logger.init_args.version", "mine")
    run = tmp_path / "runs" / "demo_softmax" / "mine"
    run.mkdir(parents=True)
    other = RunLock(run)  # another fit naming that version, training
    try:
        assert lightning_main(["fit", *args]) != 0
    finally:
        other.release()
    err = capsys.readouterr().err
    assert f"{run}: another fit is training in this run now" in err
    assert "Traceback" not in err and not (run / "checkpoints").exists()
    assert lightning_main(["fit", *args]) == 0
    assert (run / "checkpoints" / "last.ckpt").is_file()
    # Its test logs beside it, as a version_N run's does, not as a new run's.
    test = ["test", "--config", str(run / "config.yaml"), "--ckpt_path", "last"]
    assert lightning_main(test) == 0
    assert (run / "test" / "metrics.csv").is_file()
    assert sorted(path.name for path in run.parent.iterdir()) == ["mine"]
    # Resuming it by its config.yaml while another fit trains there in its first epoch (no
    # last.ckpt yet) names that fit, not a missing last.ckpt.
    (run / "checkpoints" / "last.ckpt").unlink()
    resume = ["fit", "--config", str(run / "config.yaml"), "--ckpt_path", "last"]
    capsys.readouterr()
    other = RunLock(run)
    try:
        assert lightning_main(resume) == 2
    finally:
        other.release()
    assert capsys.readouterr().err == (
        f"captioner fit: --ckpt_path last: {run}: another fit is training in this run now; "
        "wait for it to end (or stop it) before training in it again\n")
    assert lightning_main(resume) == 2
    assert capsys.readouterr().err == (
        f"captioner fit: --ckpt_path last: {run.resolve()} has no checkpoints/last.ckpt yet\n")


def test_a_new_fit_naming_a_finished_runs_version_is_refused(synthetic_data, tiny_cache,
                                                             tmp_path, capsys):
    """A fresh fit with --trainer.logger.init_args.version V where V holds a run would replace
    its last.ckpt, config.yaml and metrics, leaving its best checkpoint beside the new run's."""
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--trainer.max_epochs", "1",
                     "--trainer.logger.init_args.version", "mine")
    assert lightning_main(["fit", *args]) == 0
    run = tmp_path / "runs" / "demo_softmax" / "mine"
    before = {path: path.read_bytes() for path in run.rglob("*") if path.is_file()}
    [best] = run.glob("checkpoints/best-*.ckpt")
    cider = best.stem.removeprefix("best-epoch00-cider")
    capsys.readouterr()
    assert lightning_main(["fit", *args]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"captioner fit: {run}: holds an earlier run (checkpoints/best-epoch00-cider"
        f"{cider}.ckpt, last.ckpt), which a new fit would overwrite; resume it with captioner fit "
        f"--config {run}/config.yaml --ckpt_path last (and a larger --trainer.max_epochs if it "
        "has finished), or name another version\n"), err
    assert {path: path.read_bytes() for path in run.rglob("*") if path.is_file()} == before


def test_a_named_version_stopped_before_its_first_checkpoint_starts_over(
        synthetic_data, tiny_cache, tmp_path, capsys):
    """Ctrl-C before the first last.ckpt leaves config.yaml, hparams.yaml and metrics.csv in
    the named folder, and nothing to resume: the same command must start the run over."""
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--trainer.max_epochs", "1",
                     "--trainer.logger.init_args.version", "mine")
    run = tmp_path / "runs" / "demo_softmax" / "mine"
    run.mkdir(parents=True)
    for name in ("config.yaml", "hparams.yaml", "metrics.csv"):
        (run / name).write_text("left by a run stopped in its first epoch\n")
    assert lightning_main(["fit", *args]) == 0, capsys.readouterr().err
    assert (run / "checkpoints" / "last.ckpt").is_file()
    assert "left by" not in (run / "config.yaml").read_text()


@pytest.mark.parametrize("version", ["../elsewhere", "a/b", "..", ""])
def test_a_named_version_that_is_not_one_folder_is_refused(version, synthetic_data,
                                                           tiny_cache, tmp_path, capsys):
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--trainer.max_epochs", "1",
                     "--trainer.logger.init_args.version", version)
    assert lightning_main(["fit", *args]) == 2
    assert capsys.readouterr().err == (
        f"captioner fit: --trainer.logger.init_args.version {version!r}: a version names one "
        "folder (no '/', '.' or '..')\n")
    assert not (tmp_path / "runs").exists()


def test_a_trial_run_with_fast_dev_run_says_it_saved_nothing(synthetic_data, tiny_cache,
                                                             tmp_path, capsys):
    for named in ([], ["--trainer.logger.init_args.version", "mine"]):
        args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--trainer.fast_dev_run", "true",
                         *named)
        assert lightning_main(["fit", *args]) == 0
        out, err = capsys.readouterr()
        assert out.splitlines()[-1] == ("a trial run (fast_dev_run): no run folder, no "
                                        "checkpoint"), err
        assert "Traceback" not in err and not (tmp_path / "runs").exists()


def test_a_named_versions_own_config_resumes_it_with_its_metrics(synthetic_data, tiny_cache,
                                                                   tmp_path, capsys):
    """--trainer.logger.init_args.version mine, then mine's config.yaml with --ckpt_path last:
    mine resumes (not version_0, the newest version_N), and its earlier metrics are kept (the
    CSV logger deletes metrics.csv when it sets up); captioner runs lists it."""
    from captioner.commands import runs as runs_command

    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--trainer.max_epochs", "1")
    assert lightning_main(["fit", *args]) == 0
    assert lightning_main(["fit", *args, "--trainer.logger.init_args.version", "mine"]) == 0
    runs = tmp_path / "runs" / "demo_softmax"
    first_rows = (runs / "mine" / "metrics.csv").read_text()
    assert lightning_main(["fit", "--config", str(runs / "mine" / "config.yaml"),
                           "--ckpt_path", "last", "--trainer.max_epochs", "2"]) == 0
    assert read_epochs_done(runs / "mine") == 2 and read_epochs_done(runs / "version_0") == 1
    assert (runs / "mine" / "metrics.part1.csv").read_text() == first_rows
    assert (runs / "mine" / "metrics.csv").is_file()
    assert sorted(path.name for path in runs.iterdir()) == ["mine", "version_0"]
    capsys.readouterr()
    assert runs_command.main(["--root", str(runs.parent)]) == 0
    rows = [line.split()[:4] for line in capsys.readouterr().out.splitlines()[1:]]
    assert rows == [["demo_softmax", "version_0", "softmax/softmax", "1/1"],
                    ["demo_softmax", "mine", "softmax/softmax", "2/2"]]
    # A run's folder is not a folder of runs, though a test's folder in it has a config.yaml.
    (runs / "version_0" / "test").mkdir()
    shutil.copy(runs / "version_0" / "config.yaml", runs / "version_0" / "test")
    assert runs_command.main(["--root", str(runs)]) == 2
    assert "is a run's folder, not a folder of runs" in capsys.readouterr().err


@pytest.mark.slow
def test_ckpt_path_last_and_best_read_the_version_the_command_names(synthetic_data, tiny_cache,
                                                                    tmp_path, capsys):
    """--trainer.logger.init_args.version mine with --ckpt_path last or best: mine, not the
    newest version_N (which was resumed instead, and mine's checkpoints were reported missing
    when it was the run's only version)."""
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--trainer.max_epochs", "1")
    mine = [*args, "--trainer.logger.init_args.version", "mine"]
    assert lightning_main(["fit", *mine]) == 0
    runs = tmp_path / "runs" / "demo_softmax"
    assert lightning_main(["test", *mine, "--ckpt_path", "best"]) == 0
    assert (runs / "mine" / "test" / "metrics.csv").is_file()
    assert lightning_main(["fit", *args]) == 0  # version_0, now the newest numbered one
    assert lightning_main(["fit", *mine, "--ckpt_path", "last",
                           "--trainer.max_epochs", "2"]) == 0, capsys.readouterr().err
    assert read_epochs_done(runs / "mine") == 2 and read_epochs_done(runs / "version_0") == 1
    assert sorted(path.name for path in runs.iterdir()) == ["mine", "version_0"]
    capsys.readouterr()
    other = [*args, "--trainer.logger.init_args.version", "other"]
    assert lightning_main(["fit", *other, "--ckpt_path", "last"]) == 2
    assert capsys.readouterr().err == (
        "captioner fit: --ckpt_path last: --trainer.logger.init_args.version other names no "
        f"run: {runs / 'other'} does not exist\n")
    assert lightning_main(["fit", *args, "--trainer.logger.init_args.version", "0",
                           "--ckpt_path", "last", "--trainer.max_epochs", "2"]) == 0
    assert read_epochs_done(runs / "version_0") == 2
    # The version named on the command line wins over the one of the run's config.yaml given.
    assert lightning_main(["fit", "--config", str(runs / "version_0" / "config.yaml"),
                           "--trainer.logger.init_args.version", "mine", "--ckpt_path", "last",
                           "--trainer.max_epochs", "3"]) == 0
    assert read_epochs_done(runs / "mine") == 3 and read_epochs_done(runs / "version_0") == 2


def test_a_copied_runs_folder_resumes_and_tests_its_own_run(synthetic_data, tiny_cache,
                                                             tmp_path, capsys):
    """A run's config.yaml names the runs folder it was written in: a copy's config.yaml with
    --ckpt_path last resumed the original run (or found none once it was gone)."""
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--trainer.max_epochs", "1")
    assert lightning_main(["fit", *args]) == 0
    shutil.copytree(tmp_path / "runs", tmp_path / "copy")
    copy = tmp_path / "copy" / "demo_softmax" / "version_0"
    assert lightning_main(["fit", "--config", str(copy / "config.yaml"), "--ckpt_path", "last",
                           "--trainer.max_epochs", "2"]) == 0, capsys.readouterr().err
    assert read_epochs_done(copy) == 2
    assert read_epochs_done(tmp_path / "runs" / "demo_softmax" / "version_0") == 1
    assert lightning_main(["test", "--config", str(copy / "config.yaml"),
                           "--ckpt_path", "best"]) == 0
    assert (copy / "test" / "metrics.csv").is_file()
    assert not (tmp_path / "runs" / "demo_softmax" / "version_0" / "test").exists()
    assert sorted(path.name for path in (tmp_path / "runs" / "demo_softmax").iterdir()) == [
        "version_0"]


def _file_state(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(path.relative_to(folder)): (path.stat().st_size, path.stat().st_mtime_ns)
            for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.mark.parametrize("copy_to", ["runs/other_name/version_0", "elsewhere/plain_copy"])
def test_a_run_copied_under_another_name_resumes_as_itself(copy_to, synthetic_data,
                                                            tiny_cache, tmp_path, capsys):
    """A run is the folder its config.yaml is in: a copy of a run under another run name (or
    into a plain folder) resumed from its own config.yaml trains there, and the original run,
    which the files name, is left as it was (it was resumed and rewritten: epochs 1 -> 2)."""
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--trainer.max_epochs", "1")
    assert lightning_main(["fit", *args]) == 0
    original = tmp_path / "runs" / "demo_softmax" / "version_0"
    copy = tmp_path / copy_to
    shutil.copytree(original, copy)
    before = _file_state(original)
    capsys.readouterr()
    assert lightning_main(["fit", "--config", str(copy / "config.yaml"), "--ckpt_path", "last",
                           "--trainer.max_epochs", "2"]) == 0, capsys.readouterr().err
    assert f"run folder: {copy}" in capsys.readouterr().out
    assert read_epochs_done(copy) == 2
    assert load_safely(copy / "checkpoints" / "last.ckpt")["global_step"] == 4
    assert read_progress(copy / "checkpoints")["best_checkpoint"].startswith(f"{copy}/")
    assert _file_state(original) == before
    assert sorted(path.name for path in original.parent.iterdir()) == ["version_0"]


def _wait_a_minute(started) -> None:
    started.set()
    time.sleep(60)


def test_a_run_held_for_an_instant_as_runs_looks_at_it_is_not_refused(tmp_path):
    import threading

    from captioner.training.folders import training_now
    from captioner.training.runs import RunLock
    from data_prep.locks import hold_exclusively, let_go

    probe = hold_exclusively(tmp_path)  # as training_now holds it, for an instant
    threading.Timer(0.1, let_go, (probe,)).start()
    RunLock(tmp_path).release()
    assert training_now(tmp_path) is False


def test_a_held_run_is_let_go_when_its_fit_ends_though_a_forked_worker_lives_on(tmp_path):
    import multiprocessing

    from captioner.training.runs import RunInUse, RunLock

    held = RunLock(tmp_path)
    with pytest.raises(RunInUse, match=re.escape(str(tmp_path))):
        RunLock(tmp_path)
    context = multiprocessing.get_context("fork")
    started = context.Event()
    worker = context.Process(target=_wait_a_minute, args=(started,))
    worker.start()
    try:
        assert started.wait(30)
        held.release()  # the fit ended; its loader worker has not noticed yet
        RunLock(tmp_path).release()
    finally:
        worker.kill()
        worker.join()


def test_a_run_on_a_file_system_that_locks_no_folder_trains_with_a_warning(tmp_path,
                                                                           monkeypatch):
    # NFS emulates flock with byte-range locks and refuses an exclusive one on a descriptor
    # not open for writing, as a folder's is: every fit failed with 'bad file descriptor'.
    import errno
    import fcntl as real_fcntl

    import data_prep.locks
    from captioner.training.runs import RunLock

    def nfs_flock(fd, operation):
        raise OSError(errno.EBADF, "Bad file descriptor")

    monkeypatch.setattr(data_prep.locks, "fcntl", type("NFS", (), {
        "flock": staticmethod(nfs_flock), "LOCK_EX": real_fcntl.LOCK_EX,
        "LOCK_NB": real_fcntl.LOCK_NB}))
    open_before = len(os.listdir("/proc/self/fd"))
    with pytest.warns(UserWarning, match=re.escape(f"{tmp_path}: cannot be locked (Bad file "
                                                   "descriptor): a second fit")):
        held = RunLock(tmp_path)
    held.release()
    assert len(os.listdir("/proc/self/fd")) == open_before  # its descriptor closed


def read_epochs_done(run: Path) -> int:
    return json.loads((run / "checkpoints" / "progress.json").read_text())["epochs_done"]


@pytest.mark.slow
def test_fit_runs_without_a_logger(synthetic_data, tiny_cache, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # Lightning's default_root_dir: the working directory
    args = _cli_args(synthetic_data, tiny_cache, tmp_path)
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1",
                           "--trainer.logger", "false"]) == 0
    folder = tmp_path / "checkpoints"
    assert (folder / "last.ckpt").is_file()
    # A second fresh run would replace the first one's last.ckpt, beside its best checkpoint;
    # so would one given the same --checkpoint.dirpath.
    before = {path: path.read_bytes() for path in folder.iterdir()}
    capsys.readouterr()
    for again in (["--trainer.logger", "false"], ["--checkpoint.dirpath", str(folder)]):
        assert lightning_main(["fit", *args, "--trainer.max_epochs", "1", *again]) == 2
        [best] = folder.glob("best-*.ckpt")
        assert capsys.readouterr().err == (
            f"captioner fit: {folder}: holds checkpoints of an earlier run ({best.name}, "
            f"last.ckpt), which a new fit would overwrite; resume it with --ckpt_path "
            f"{folder / 'last.ckpt'}, or give the new run another checkpoint folder\n")
    assert {path: path.read_bytes() for path in folder.iterdir()} == before
    # Refused before its version folder was made: neither it nor the runs folder is left.
    assert not (tmp_path / "runs").exists()
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "2", "--trainer.logger",
                           "false", "--ckpt_path", str(folder / "last.ckpt")]) == 0
    assert read_epochs_done(folder.parent) == 2
    # 'last' without a logger is the checkpoint folder's, not the newest run's of runs/NAME
    # (which it resumed, writing that run's continuation over ./checkpoints).
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1",
                           "--trainer.limit_train_batches", "3"]) == 0
    [run] = (tmp_path / "runs").glob("*/version_0")
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "3", "--trainer.logger",
                           "false", "--ckpt_path", "last"]) == 0
    assert (read_epochs_done(folder.parent), read_epochs_done(run)) == (3, 1)
    # From step 4 (2 epochs of 2 batches) on, not from that run's step 3.
    assert read_progress(folder)["global_step"] == 6
    # validate and test without a logger log nothing, config.yaml neither: the fit's stays.
    fit_config = (tmp_path / "config.yaml").read_bytes()
    assert lightning_main(["test", *args, "--trainer.logger", "false", "--ckpt_path",
                           "best"]) == 0
    assert (tmp_path / "config.yaml").read_bytes() == fit_config
    # A fresh fit without a logger would write its config.yaml over one of the user's own.
    elsewhere = tmp_path / "mine"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    (elsewhere / "config.yaml").write_text("my: own file\n")
    capsys.readouterr()
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1", "--trainer.logger",
                           "false"]) == 2
    assert capsys.readouterr().err == (
        f"captioner fit: {elsewhere / 'config.yaml'}: exists, and a fit with --trainer.logger "
        "false writes its config.yaml there, in place of it (the folder it runs in is its run "
        "folder); move it, or train with a logger (runs/NAME/version_N)\n")
    assert (elsewhere / "config.yaml").read_text() == "my: own file\n"
    assert sorted(p.name for p in elsewhere.iterdir()) == ["config.yaml"]
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1", "--trainer.logger",
                           "false", "--ckpt_path", "last"]) == 2
    assert capsys.readouterr().err == (
        f"captioner fit: --ckpt_path last: no {Path('checkpoints') / 'last.ckpt'}: with "
        "--trainer.logger false, 'last' is that of the checkpoint folder checkpoints\n")


def test_the_best_checkpoint_monitors_a_metric_the_model_logs(synthetic_data, tiny_cache,
                                                              tmp_path, capsys):
    """A misspelt --checkpoint.monitor is refused before training (Lightning finds out after
    the first epoch's validation, and that epoch is lost); the names it may take are exactly
    those a fit logs."""
    from captioner.training.module import LOGGED_METRICS

    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--trainer.max_epochs", "1")
    assert lightning_main(["fit", *args, "--checkpoint.monitor", "val/CIDER"]) == 2
    assert capsys.readouterr().err == (
        "captioner fit: --checkpoint.monitor 'val/CIDER' is not a metric the model logs "
        "(train/loss, val/Bleu_4, val/CIDEr)\n")
    assert not (tmp_path / "runs").exists()
    assert lightning_main(["fit", *args, "--checkpoint.monitor", "train/loss"]) == 2
    assert capsys.readouterr().err == (
        "captioner fit: --checkpoint.monitor 'train/loss' with --checkpoint.mode 'max' would "
        "keep the worst epoch; give --checkpoint.mode min\n")
    assert lightning_main(["fit", *args, "--checkpoint.monitor", "val/Bleu_4",
                           "--checkpoint.mode", "min"]) == 2
    assert "give --checkpoint.mode max" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
    assert lightning_main(["fit", *args, "--checkpoint.monitor", "val/Bleu_4",
                           "--trainer.log_every_n_steps", "1"]) == 0
    [metrics] = (tmp_path / "runs").glob("*/version_0/metrics.csv")
    columns = metrics.read_text().splitlines()[0].split(",")
    assert sorted(set(columns) - {"epoch", "step"}) == sorted(LOGGED_METRICS)
    # The best checkpoint's name gives the score it was chosen on, read from the log.
    [best] = metrics.parent.glob("checkpoints/best-*.ckpt")
    bleu = [row["val/Bleu_4"] for row in csv.DictReader(metrics.open()) if row["val/Bleu_4"]]
    assert best.name == f"best-epoch00-bleu_4={float(bleu[-1]):.4f}.ckpt"
    # captioner runs gives the metric the best score is of (it gave the number alone, in the
    # column of other runs' CIDEr).
    from captioner.commands import runs

    capsys.readouterr()
    assert runs.main(["--root", str(tmp_path / "runs")]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert f" Bleu_4 {float(bleu[-1]):.4f}  best {best}" in row
    assert header.index("best") == row.index("Bleu_4")


def test_runs_lists_a_run_whose_checkpoints_are_kept_elsewhere(synthetic_data, tiny_cache,
                                                               tmp_path, capsys):
    """With --checkpoint.dirpath outside the run's folder, `captioner runs` still gives the
    run's epochs, best score and both checkpoints (it said "no checkpoint yet")."""
    from captioner.commands import runs

    elsewhere = tmp_path / "kept"
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--trainer.max_epochs", "1",
                     "--checkpoint.dirpath", str(elsewhere))
    assert lightning_main(["fit", *args]) == 0
    [best] = elsewhere.glob("best-*.ckpt")
    capsys.readouterr()
    assert runs.main(["--root", str(tmp_path / "runs")]) == 0
    [row] = capsys.readouterr().out.splitlines()[1:]
    assert row.split()[:6] == ["demo_softmax", "version_0", "softmax/softmax", "1/1", "2",
                               "CIDEr"]
    assert row.endswith(f"best {best.resolve()}  last {(elsewhere / 'last.ckpt').resolve()}")
    # It is the newest run, so `best` is its best checkpoint (it was an older run's).
    assert lightning_main(["test", *_cli_args(synthetic_data, tiny_cache, tmp_path),
                           "--ckpt_path", "best"]) == 0
    logged = re.search(r"scores logged in (.+)\n", capsys.readouterr().out).group(1)
    saved = yaml.safe_load((Path(logged).parent / "config.yaml").read_text())
    assert saved["ckpt_path"] == str(best.resolve())


@pytest.mark.slow
def test_a_misspelt_key_of_a_config_file_names_the_config_files(synthetic_data, tiny_cache,
                                                                tmp_path, capsys):
    typo = tmp_path / "mine.yaml"
    typo.write_text("data:\n  min_cout: 2\n")
    args = _cli_args(synthetic_data, tiny_cache, tmp_path)
    code, _, err = _call(capsys, "fit", *args, "--config", str(typo))
    assert code == 2 and "Traceback" not in err
    [line] = [line for line in err.splitlines() if line.startswith("captioner fit: ")]
    assert line.startswith("captioner fit: --config ") and f"demo_softmax.yaml, {typo}: " in line
    assert "does not accept option 'data.min_cout'" in line


@pytest.mark.slow
def test_a_bad_value_names_the_config_files_only_when_it_comes_from_them(
        synthetic_data, tiny_cache, tmp_path, capsys):
    bad = tmp_path / "mine.yaml"
    bad.write_text("model:\n  lr: big\n")
    args = _cli_args(synthetic_data, tiny_cache, tmp_path)
    for extra, named in ((["--config", str(bad)], True), (["--model.lr", "big"], False)):
        code, _, err = _call(capsys, "fit", *args, *extra)
        assert code == 2 and "Traceback" not in err
        [line] = [line for line in err.splitlines() if line.startswith("captioner fit: ")]
        assert line.endswith('Parser key "model.lr": Expected a <class \'float\'>. Got '
                             "value: big" if named else
                             "--model.lr: invalid value big (expected float)")
        assert line.startswith("captioner fit: --config ") == named, line
    # The file's bad value fails the parse although the command line gives the key a good one.
    code, _, err = _call(capsys, "fit", *args, "--config", str(bad), "--model.lr", "0.1")
    assert code == 2 and f"{bad}: Parser key \"model.lr\"" in err, err


def test_a_bad_value_of_a_union_is_one_short_line(synthetic_data, tiny_cache, tmp_path,
                                                  capsys):
    # jsonargparse lists every type of a union it tried, over several lines.
    args = _cli_args(synthetic_data, tiny_cache, tmp_path)
    code, _, err = _call(capsys, "fit", *args, "--trainer.max_epochs", "two")
    assert code == 2 and err == (
        "captioner fit: --trainer.max_epochs: invalid value two (expected int or null)\n"), err
    code, _, err = _call(capsys, "fit", *args, "--trainer.precision", "7")
    assert code == 2 and err.startswith(
        "captioner fit: --trainer.precision: invalid value 7 (expected one of 64, 32, 16, ")
    assert "16-mixed" in err and err.endswith(", null)\n") and err.count("\n") == 1, err


@pytest.mark.parametrize("text", [
    "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 9)),
    "a: &a [1, *a]\n",
], ids=["nested aliases", "an alias inside itself"])
def test_a_config_whose_aliases_expand_past_any_settings_is_refused(text, tmp_path, capsys):
    # 400 bytes expanding to 10**9 values: the parser would take all memory expanding them.
    config = tmp_path / "bomb.yaml"
    config.write_text(text)
    assert lightning_main(["fit", "--config", str(config)]) == 2
    assert capsys.readouterr().err == (
        f"captioner fit: --config {config}: its YAML aliases expand to more than 100,000 "
        "values; a config holds settings\n")


def test_an_option_before_a_config_that_sets_it_is_refused_not_replaced(tmp_path, capsys):
    # The command line is applied in order: coco_tvmax.yaml's base/paper_trainer.yaml sets
    # max_epochs 50, which would replace the 2 given before it.
    tvmax = str(REPO / "configs" / "coco_tvmax.yaml")
    assert lightning_main(["fit", "--trainer.max_epochs", "2", "--config", tvmax]) == 2
    assert capsys.readouterr().err == (
        f"captioner fit: --trainer.max_epochs comes before --config {tvmax}, which sets "
        "trainer.max_epochs and would replace it; give the --config files first, then the "
        "options that change them\n")
    assert lightning_main(["test", "--model.output_attention_kwargs", "{lam: 0.1}",
                           "--config", tvmax]) == 2
    assert "which sets model.output_attention_kwargs and" in capsys.readouterr().err
    # Every spelling of --config; a config that cannot be read is left to the CLI's own parse.
    assert lightning_main(["fit", "--trainer.max_epochs", "2", f"-c{tvmax}"]) == 2
    assert "--trainer.max_epochs comes before --config" in capsys.readouterr().err
    assert lightning_main(["fit", "--trainer.max_epochs", "2", "--config",
                           "trainer: {max_epochs: 3}"]) == 2
    assert "which sets trainer.max_epochs" in capsys.readouterr().err
    missing = str(tmp_path / "missing.yaml")
    assert lightning_main(["fit", "--trainer.max_epochs", "2", "--config", missing]) == 2
    err = capsys.readouterr().err
    assert "comes before" not in err and "missing.yaml" in err and len(err.splitlines()) == 1
    # An option that no later config sets keeps its value wherever it stands.
    with pytest.raises(SystemExit):
        lightning_main(["fit", "--run_name", "mine", "--config", tvmax, "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["run_name"] == "mine"
    assert printed["trainer"]["logger"]["init_args"]["name"] == "mine"


def test_a_missing_include_of_a_config_file_is_named_once_with_where_it_was_looked_for(
        tmp_path, capsys):
    config = tmp_path / "mine.yaml"
    config.write_text("data: base/coco_dat.yaml\n")
    assert lightning_main(["fit", "--config", str(config)]) == 2
    assert capsys.readouterr().err == (
        f"captioner fit: --config {config}: Parser key \"data\": Unable to load config "
        f"'base/coco_dat.yaml': no such file ({tmp_path / 'base' / 'coco_dat.yaml'})\n")
    config.write_text("config: base/nothere.yaml\n")
    assert lightning_main(["fit", "--config", str(config)]) == 2
    assert capsys.readouterr().err.startswith(f"captioner fit: --config {config}: ")


@pytest.mark.subprocess
def test_unknown_output_mapping_is_refused_before_training_starts(synthetic_data, tiny_cache,
                                                                 tmp_path):
    # A child process: the absence of Lightning's model summary on the console is tested.
    args = _cli_args(synthetic_data, tiny_cache, tmp_path)
    code, out, err = _run("fit", *args, "--trainer.max_epochs", "1",
                          "--model.output_mapping", "foo")
    assert code == 2 and "Traceback" not in err, err[-2000:]
    errors = [line for line in err.splitlines() if line.startswith("captioner fit: ")]
    assert len(errors) == 1 and "unknown output_mapping 'foo'" in errors[0], err
    assert "Total params" not in out + err  # no model summary: training never began
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_unloadable_encoder_weights_are_one_line_and_exit_2(synthetic_data, tiny_cache,
                                                           tmp_path, capsys):
    # The same error as named ImageNet weights that are neither cached nor downloadable.
    weights = tmp_path / "encoder.pt"
    weights.write_bytes(b"not a state_dict")
    args = _cli_args(synthetic_data, tiny_cache, tmp_path)
    # Without a feature cache: one of other weights would be refused first (see below).
    code, _, err = _call(capsys, "fit", *args, "--trainer.max_epochs", "1",
                         "--data.feature_cache", "null", "--model.encoder_weights", str(weights))
    assert code == 2 and "Traceback" not in err, err[-2000:]
    errors = [line for line in err.splitlines() if line.startswith("captioner fit: ")]
    assert len(errors) == 1 and "encoder weights file" in errors[0] and str(weights) in errors[0]


@pytest.mark.slow
def test_a_cache_of_other_weights_is_named_before_the_weights_are_loaded(
        synthetic_data, tiny_cache, tmp_path, capsys):
    # A paper config names ImageNet weights, which an offline machine lacks; a cache written
    # with `prepare-features --weights none` needs its own NAME.encoder.pt. The error says so,
    # not that the ImageNet weights could not be downloaded.
    args = _cli_args(synthetic_data, tiny_cache, tmp_path)
    code, _, err = _call(capsys, "fit", *args, "--trainer.max_epochs", "1",
                        "--model.encoder_weights", "IMAGENET1K_V1")
    assert code == 2 and "Traceback" not in err, err[-2000:]
    [line] = [line for line in err.splitlines() if line.startswith("captioner fit: ")]
    cached = FeatureCache(tiny_cache).encoder["weights"]
    assert f"feature cache {tiny_cache} was written with encoder weights={cached!r}" in line
    assert f"set model.encoder_weights to {cached}" in line
    assert not list(tmp_path.glob("runs/*"))


@pytest.mark.slow
def test_a_cache_moved_with_its_encoder_file_trains(synthetic_data, tiny_cache, tmp_path, capsys):
    # The cache records its NAME.encoder.pt by absolute path; copied to another machine or
    # folder together, the weights are the same bytes under another path.
    moved = tmp_path / "moved"
    moved.mkdir()
    weights = Path(FeatureCache(tiny_cache).encoder["weights"])
    shutil.copy(tiny_cache, moved / tiny_cache.name)
    shutil.copy(weights, moved / weights.name)
    args = _cli_args(synthetic_data, moved / tiny_cache.name, tmp_path,
                     "--model.encoder_weights", str(moved / weights.name))
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1"]) == 0
    other = moved / "other.pt"
    torch.save({k: v + 1 for k, v in torch.load(weights).items()}, other)
    code, _, err = _call(capsys, "fit", *args, "--trainer.max_epochs", "1",
                        "--model.encoder_weights", str(other))
    assert code == 2 and f"was written with encoder weights={str(weights)!r}" in err, err[-2000:]


def test_a_cache_of_other_weights_than_a_checkpoints_asks_for_another_cache(tiny_cache):
    # The model of a --ckpt_path checkpoint keeps its encoder_weights: setting them to the
    # cache's would be refused in turn, so the advice is another cache.
    from captioner.features.cache_check import CACHE_SETTINGS, check_feature_cache

    cache = FeatureCache(tiny_cache)
    settings = {option: cache.encoder.get(key, "layer4") for key, option in CACHE_SETTINGS.items()}
    settings.update({"model.encoder_trainable": False, "model.encoder_weights": "IMAGENET1K_V1"})
    with pytest.raises(ValueError) as error:
        check_feature_cache(settings, cache, checkpoint="runs/a/version_0/checkpoints/last.ckpt")
    assert str(error.value).endswith(
        "; the model of runs/a/version_0/checkpoints/last.ckpt keeps "
        "model.encoder_weights=IMAGENET1K_V1: give a feature cache written with that encoder, "
        "or --data.feature_cache null to read the images")
    with pytest.raises(ValueError, match="to use this cache, set model.encoder_weights to"):
        check_feature_cache(settings, cache)


def test_a_moved_caches_advice_names_its_encoder_file_where_it_now_lies(tiny_cache, tmp_path):
    # The cache records its NAME.encoder.pt by absolute path; moved together to another folder,
    # the advice must name the file beside the cache, not the recorded path that is gone.
    from types import SimpleNamespace

    from captioner.features.cache_check import CACHE_SETTINGS, check_feature_cache
    from data_prep.hashes import file_sha256

    cache = FeatureCache(tiny_cache)
    recorded = Path(cache.encoder["weights"])
    moved = tmp_path / "moved" / tiny_cache.name
    moved.parent.mkdir()
    beside = moved.with_name(f"{moved.stem}.encoder.pt")
    shutil.copy(recorded, beside)
    gone = str(tmp_path / "gone" / recorded.name)
    settings = {option: cache.encoder.get(key, "layer4") for key, option in CACHE_SETTINGS.items()}
    settings.update({"model.encoder_trainable": False, "model.encoder_weights": "none"})
    for weights_sha256, advised in ((file_sha256(recorded), beside),
                                    ("0" * 64, f"{gone} (no longer there: a copy of it)")):
        moved_cache = SimpleNamespace(path=moved, encoder={**cache.encoder, "weights": gone},
                                      weights_sha256=weights_sha256)
        with pytest.raises(ValueError) as error:
            check_feature_cache(settings, moved_cache)
        assert str(error.value).endswith(f"set model.encoder_weights to {advised}")


def test_a_cache_of_another_encoder_names_every_setting_that_differs(tiny_cache):
    # Set one by one, the paper config's defaults (resnet101, layer4, 256 px, ImageNet weights)
    # took four refused runs to fit a cache of --arch resnet18 --layer layer3.
    from captioner.features.cache_check import CACHE_SETTINGS, check_feature_cache

    cache = FeatureCache(tiny_cache)
    needed = {option: cache.encoder.get(key, "layer4") for key, option in CACHE_SETTINGS.items()}
    settings = {"model.encoder_arch": "resnet101", "model.encoder_weights": "IMAGENET1K_V2",
                "data.image_size": needed["data.image_size"] + 1,
                "model.encoder_layer": "layer4" if needed["model.encoder_layer"] == "layer3"
                else "layer3", "model.encoder_trainable": False}
    with pytest.raises(ValueError) as error:
        check_feature_cache(settings, cache)
    message = str(error.value)
    assert message.endswith("; to use this cache, set " + ", ".join(
        f"{option} to {needed[option]}" for option in CACHE_SETTINGS.values())), message
    assert "but the model has arch='resnet101', weights='IMAGENET1K_V2', image_size=" in message


def test_validate_and_test_without_a_checkpoint_are_refused(synthetic_data, tiny_cache,
                                                             tmp_path, capsys):
    # Lightning would score the config's untrained model, in a new run folder.
    args = _cli_args(synthetic_data, tiny_cache, tmp_path)
    for subcommand in ("validate", "test"):
        assert lightning_main([subcommand, *args]) == 2
        assert capsys.readouterr().err == (
            f"captioner {subcommand}: {subcommand} scores a trained model: give --ckpt_path "
            "best, last or a checkpoint file\n")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("epoch", [0, 1])
def test_ctrl_c_stops_fit_with_status_130_and_says_how_to_resume(synthetic_data, tiny_cache,
                                                                 tmp_path, capsys, monkeypatch,
                                                                 epoch):
    import signal

    from captioner.training.module import CaptioningModule

    step = CaptioningModule.training_step

    def interrupted(self, batch, batch_idx):
        if self.current_epoch == epoch and batch_idx == 1:
            raise KeyboardInterrupt
        return step(self, batch, batch_idx)

    monkeypatch.setattr(CaptioningModule, "training_step", interrupted)
    handler = signal.getsignal(signal.SIGINT)  # Lightning ignores Ctrl-C while it shuts down
    try:
        code = lightning_main(["fit", *_cli_args(synthetic_data, tiny_cache, tmp_path),
                               "--trainer.max_epochs", "3"])
    finally:
        signal.signal(signal.SIGINT, handler)
    assert code == 130
    [line] = [line for line in capsys.readouterr().err.splitlines()
              if line.startswith("captioner fit: ")]
    last = tmp_path / "runs" / "demo_softmax" / "version_0" / "checkpoints" / "last.ckpt"
    run_config = last.parent.parent / "config.yaml"
    assert line == ("captioner fit: interrupted before the first last.ckpt (written at the end "
                    "of every epoch): nothing to resume" if epoch == 0 else
                    f"captioner fit: interrupted; captioner fit --config {run_config} "
                    f"--ckpt_path last resumes from {last} (epochs done: 1)")


def test_a_fit_from_an_earlier_runs_config_stopped_names_the_command_that_resumes_it(
        synthetic_data, tiny_cache, tmp_path, capsys, monkeypatch):
    """Started from version_0's config.yaml, a new run (version_1) stopped by Ctrl-C: the same
    command with --ckpt_path last would resume version_0 (the run whose config.yaml it is), so
    the line gives version_1's own config.yaml, and that command resumes version_1."""
    import shlex
    import signal

    from captioner.training.module import CaptioningModule

    assert lightning_main(["fit", *_cli_args(synthetic_data, tiny_cache, tmp_path),
                           "--trainer.max_epochs", "1"]) == 0
    runs = tmp_path / "runs" / "demo_softmax"
    first = (runs / "version_0" / "config.yaml").read_text()
    step = CaptioningModule.training_step

    def interrupted(self, batch, batch_idx):
        if self.current_epoch == 1 and batch_idx == 1:
            raise KeyboardInterrupt
        return step(self, batch, batch_idx)

    monkeypatch.setattr(CaptioningModule, "training_step", interrupted)
    handler = signal.getsignal(signal.SIGINT)  # Lightning ignores Ctrl-C while it shuts down
    try:
        code = lightning_main(["fit", "--config", str(runs / "version_0" / "config.yaml"),
                               "--trainer.max_epochs", "3"])
    finally:
        signal.signal(signal.SIGINT, handler)
    monkeypatch.setattr(CaptioningModule, "training_step", step)
    assert code == 130
    [line] = [line for line in capsys.readouterr().err.splitlines()
              if line.startswith("captioner fit: ")]
    command, rest = line.removeprefix("captioner fit: interrupted; ").split(" resumes from ")
    assert rest == f"{runs / 'version_1' / 'checkpoints' / 'last.ckpt'} (epochs done: 1)"
    own_config = runs / "version_1" / "config.yaml"
    assert command == f"captioner fit --config {own_config} --ckpt_path last"
    assert lightning_main(shlex.split(command)[1:]) == 0
    assert read_epochs_done(runs / "version_1") == 3
    assert (runs / "version_0" / "config.yaml").read_text() == first
    assert read_epochs_done(runs / "version_0") == 1


def test_ctrl_c_while_a_checkpoint_is_written_keeps_it_and_exits_130(
        synthetic_data, tiny_cache, tmp_path, capsys, ctrl_c_inside_torch_save):
    ctrl_c_inside_torch_save(3)  # the first checkpoint written after epoch 0's two
    code = lightning_main(["fit", *_cli_args(synthetic_data, tiny_cache, tmp_path),
                           "--trainer.max_epochs", "3"])
    assert code == 130
    [line] = [line for line in capsys.readouterr().err.splitlines()
              if line.startswith("captioner fit: ")]
    folder = tmp_path / "runs" / "demo_softmax" / "version_0" / "checkpoints"
    run_config = folder.parent / "config.yaml"
    assert line.startswith(f"captioner fit: interrupted; captioner fit --config {run_config} "
                           f"--ckpt_path last resumes from {folder / 'last.ckpt'} "
                           "(epochs done: "), line
    assert not list(folder.glob(".*.tmp"))
    for checkpoint in folder.glob("*.ckpt"):
        assert "state_dict" in load_safely(checkpoint)


@pytest.mark.subprocess
def test_a_runs_folder_that_cannot_be_made_is_one_line(synthetic_data, tiny_cache, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    args = _cli_args(synthetic_data, tiny_cache, tmp_path,
                     "--trainer.logger.init_args.save_dir", str(blocker / "runs"))
    code, _, err = _run("fit", *args, "--trainer.max_epochs", "1")
    assert code == 2 and "Traceback" not in err, err[-2000:]
    [line] = [line for line in err.splitlines() if line.startswith("captioner fit: ")]
    assert line == (f"captioner fit: {blocker / 'runs'}: cannot write to it: {blocker} is not "
                    "a folder")


@pytest.mark.subprocess
def test_captioner_debug_shows_the_traceback(synthetic_data, tiny_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("CAPTIONER_DEBUG", "1")
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--data.karpathy_json", "missing.json")
    code, _, err = _run("fit", *args, "--trainer.max_epochs", "1")
    assert code != 0 and "Traceback" in err and "missing.json" in err


@pytest.mark.subprocess
def test_a_checkpoint_cannot_make_fit_import_code(synthetic_data, tiny_cache, tmp_path):
    args = _cli_args(synthetic_data, tiny_cache, tmp_path)
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1"]) == 0
    last = tmp_path / "runs" / "demo_softmax" / "version_0" / "checkpoints" / "last.ckpt"
    checkpoint = load_safely(last)
    checkpoint["hyper_parameters"]["output_attention_kwargs"] = {"lam": {"class_path": "this.X"}}
    evil = tmp_path / "evil.ckpt"
    save_atomically(checkpoint, evil)
    code, out, err = _run("test", *args, "--ckpt_path", str(evil))
    assert code == 2 and "class specification" in err and "evil.ckpt" in err
    assert "Zen of Python" not in out + err  # `import this` prints it


def test_checkpoints_of_earlier_versions_still_load(synthetic_data, tiny_cache, tmp_path):
    from captioner.inference.pipeline import Captioner

    args = _cli_args(synthetic_data, tiny_cache, tmp_path)
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1"]) == 0
    last = tmp_path / "runs" / "demo_softmax" / "version_0" / "checkpoints" / "last.ckpt"
    checkpoint = load_safely(last)
    hparams = checkpoint["hyper_parameters"]
    assert "_instantiator" in hparams  # what LightningCLI stores beside the arguments
    del hparams["decoding"]
    hparams.update(beam_size=1, max_length=5)  # the keys before DecodingOptions
    old = tmp_path / "old.ckpt"
    save_atomically(checkpoint, old)
    captioner = Captioner.load(old)
    assert (captioner.decoding.beam_size, captioner.decoding.max_length) == (1, 5)
    assert lightning_main(["test", *args, "--ckpt_path", str(old)]) == 0


def test_a_checkpoint_keeps_the_image_size_it_was_trained_at(synthetic_data, tiny_cache,
                                                            tmp_path, capsys):
    # The image size is the data's setting, linked to the model: a test with the config of
    # another size (the paper's 256) scored a model trained at 128 on 256 px images.
    args = _cli_args(synthetic_data, tiny_cache, tmp_path)
    trained = _image_size(synthetic_data)
    assert trained != 256  # the demo config's size
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1"]) == 0
    run = tmp_path / "runs" / "demo_softmax" / "version_0"
    last = run / "checkpoints" / "last.ckpt"
    at = args.index("--data.image_size")
    other_size = [*args[:at], *args[at + 2:], "--data.feature_cache", "null"]
    demo = str(REPO / "configs" / "demo_softmax.yaml")
    assert lightning_main(["test", *other_size, "--ckpt_path", str(last)]) == 2
    assert capsys.readouterr().err.startswith(
        f"captioner test: --config {demo} sets data.image_size: 256, but {last} was trained "
        f"with {trained}, and a model loaded from a checkpoint keeps its hyperparameters")
    assert lightning_main(["test", *other_size, "--data.image_size", "64", "--ckpt_path",
                           str(last)]) == 2
    assert capsys.readouterr().err.startswith(
        f"captioner test: --data.image_size 64, but {last} was trained with {trained}")
    # A config that sets no size: the checkpoint's, which the cache of that size fits (the
    # default, 256, is refused by the cache).
    config = yaml.safe_load((run / "config.yaml").read_text())
    del config["data"]["image_size"]
    sizeless = tmp_path / "sizeless.yaml"
    sizeless.write_text(yaml.safe_dump(config))
    assert lightning_main(["test", "--config", str(sizeless), "--ckpt_path", str(last)]) == 0
    used = yaml.safe_load((run / "test" / "config.yaml").read_text())
    assert used["data"]["image_size"] == trained


@pytest.mark.slow
def test_a_checkpoint_keeps_its_hyperparameters_and_takes_decoding_options(
        synthetic_data, tiny_cache, tmp_path, capsys):
    args = _cli_args(synthetic_data, tiny_cache, tmp_path)
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1"]) == 0
    last = tmp_path / "runs" / "demo_softmax" / "version_0" / "checkpoints" / "last.ckpt"
    code, _, err = _call(capsys, "fit", *args, "--trainer.max_epochs", "2", "--ckpt_path", "last",
                        "--model.hidden_dim", "64")
    assert code == 2 and "Traceback" not in err, err[-2000:]
    [line] = [line for line in err.splitlines() if line.startswith("captioner fit: ")]
    assert line == (f"captioner fit: --model.hidden_dim 64, but {last} was trained with 32, and a "
                    "model loaded from a checkpoint keeps its hyperparameters (leave "
                    "--model.hidden_dim out; model.decoding.* may change)")
    # A config file that sets another mapping is refused as the command line is, naming it.
    tvmax = str(REPO / "configs" / "demo_tvmax.yaml")
    assert lightning_main(["test", "--config", tvmax, *args[2:], "--ckpt_path", str(last)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"captioner test: --config {tvmax} sets model.output_attention: tvmax, "
                          f"but {last} was trained with softmax, and a model loaded from a "
                          "checkpoint keeps its hyperparameters (give the config it was "
                          "trained with, such as its run's config.yaml;"), err
    assert lightning_main(["test", *args, "--ckpt_path", str(last),
                           "--model.decoding.beam_size", "1",
                           "--model.decoding.max_length", "4"]) == 0
    used = yaml.safe_load((last.parents[1] / "test" / "config.yaml").read_text())["model"]
    assert (used["decoding"]["beam_size"], used["decoding"]["max_length"]) == (1, 4)
    assert used["hidden_dim"] == 32
    # The run's own config.yaml sets every model key, each as the checkpoint has it.
    config = last.parents[1] / "config.yaml"
    assert lightning_main(["test", "--config", str(config), "--ckpt_path", str(last),
                           "--trainer.logger.init_args.save_dir", str(tmp_path / "runs")]) == 0
    # A config of model settings alone (no data keys for the data -> model links), given as
    # -cFILE or as a YAML string: compared all the same.
    same = tmp_path / "attention_32.yaml"
    same.write_text("model:\n  attention_dim: 32\n")
    other = tmp_path / "attention_16.yaml"
    other.write_text("model:\n  attention_dim: 16\n")
    for config, code in ((f"-c{same}", 0), (f"-c{other}", 2),
                         ("model: {attention_dim: 16}", 2)):
        given = [config] if config.startswith("-c") else ["--config", config]
        assert lightning_main(["test", *args[:2], *given, *args[2:], "--ckpt_path",
                               str(last)]) == code, config
        err = capsys.readouterr().err
        assert (code == 0) == ("sets model.attention_dim: 16, but" not in err), err
    # An abbreviated option would escape that scan: refused.
    assert lightning_main(["test", "--conf", str(other), *args, "--ckpt_path", str(last)]) == 2
    assert "--conf" in capsys.readouterr().err


def test_missing_cache_key_is_an_error_naming_it(synthetic_data, tiny_cache, tmp_path, capsys):
    raw = json.loads(synthetic_data.karpathy_json.read_text())
    raw["images"][0]["cocoid"] = 987654
    broken = tmp_path / "dataset_extra.json"
    broken.write_text(json.dumps(raw))
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--data.karpathy_json", str(broken))
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1"]) == 2
    assert "987654" in capsys.readouterr().err
    # Refused as the data module sets up, after the logger made runs/NAME/version_0: neither
    # is left behind.
    assert not list(tmp_path.glob("runs/*"))


def test_a_cache_of_other_images_under_the_same_ids_is_refused(synthetic_data, tiny_cache,
                                                               tmp_path, capsys):
    # Two split files that number their images alike (prepare-dataset counts from 0): the
    # cache records which file each id was, so the other dataset's features are not used.
    raw = json.loads(synthetic_data.karpathy_json.read_text())
    first, second = raw["images"][0], raw["images"][1]
    first["filename"], second["filename"] = second["filename"], first["filename"]
    other = tmp_path / "dataset_other.json"
    other.write_text(json.dumps(raw))
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--data.karpathy_json", str(other))
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1"]) == 2
    err = capsys.readouterr().err
    image_id = first.get("cocoid", first.get("imgid"))
    name = "/".join(part for part in (first.get("filepath"), second["filename"]) if part)
    assert f"was made from other images than {other}: image id {image_id} is {name} there" in err
    assert "(2 of " in err and "make a cache of this split file" in err
    assert not list(tmp_path.glob("runs/*"))


def test_cache_of_another_encoder_is_refused(synthetic_data, tiny_cache, tmp_path, capsys):
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--model.encoder_arch", "resnet34",
                     "--model.encoder_weights", "null")
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1"]) == 2
    assert re.search("arch='resnet18'.*resnet34.*set model.encoder_arch to resnet18",
                     capsys.readouterr().err)
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--model.encoder_layer", "layer4")
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1"]) == 2
    assert re.search("layer='layer3'.*layer='layer4'", capsys.readouterr().err)
    # Refused as the data is set up: no empty run folder is left for `captioner runs` to list.
    assert not list(tmp_path.glob("runs/*/version_*"))


# Lightning's DDP on two CPU processes (gloo).
DDP_ON_TWO_CPUS = ("--trainer.strategy", "ddp", "--trainer.devices", "2",
                   "--trainer.accelerator", "cpu")


def _ddp_fit(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``captioner fit ARGS`` in a subprocess in ``cwd``, which must exit with status 0."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PL_DISABLE_FORK": "1"}
    run = subprocess.run([sys.executable, "-m", "captioner.cli", "fit", *args], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=240)
    # Exit status 0 also means the process group was destroyed: gloo threads left alive at
    # interpreter exit abort a rank (exit -6) after the work is done.
    assert run.returncode == 0, run.stderr[-3000:]
    return run


@pytest.mark.ddp
def test_two_process_ddp_on_cpu(synthetic_data, tiny_cache, tmp_path):
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, *DDP_ON_TWO_CPUS,
                     "--trainer.max_epochs", "1")
    run = _ddp_fit(args, tmp_path)
    assert "terminate called" not in run.stderr
    assert run.stdout.count("run folder:") == 1  # the summary comes from rank 0 only
    assert "distributed_backend=gloo" in run.stderr + run.stdout
    assert "All distributed processes registered" in run.stderr + run.stdout
    assert "sync_dist=True" not in run.stderr  # the epoch metrics agree across processes
    checkpoints = tmp_path / "runs" / "demo_softmax" / "version_0" / "checkpoints"
    checkpoint = load_safely(checkpoints / "last.ckpt")
    assert checkpoint["global_step"] == 2  # per process: 2 batches of the sharded data
    metrics = list(csv.DictReader(next((tmp_path / "runs").rglob("metrics.csv")).open()))
    assert any(row.get("val/CIDEr") for row in metrics)


@pytest.mark.ddp
def test_ddp_resume_ends_with_the_weights_of_an_uninterrupted_run(synthetic_data, tiny_cache,
                                                                  tmp_path):
    # The two processes' batches differ in length, so their dropout draws and RNG states do:
    # each process must get its own states back.
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    straight.mkdir()
    resumed.mkdir()
    _ddp_fit([*_cli_args(synthetic_data, tiny_cache, straight, *DDP_ON_TWO_CPUS),
              "--trainer.max_epochs", "3"], straight)
    args = _cli_args(synthetic_data, tiny_cache, resumed, *DDP_ON_TWO_CPUS)
    _ddp_fit([*args, "--trainer.max_epochs", "2"], resumed)
    _ddp_fit([*args, "--trainer.max_epochs", "3", "--ckpt_path", "last"], resumed)
    last = Path("runs", "demo_softmax", "version_0", "checkpoints", "last.ckpt")
    a, b = load_safely(straight / last), load_safely(resumed / last)
    assert a["global_step"] == b["global_step"] == 6
    assert len(b["callbacks"]["LastCheckpoint"]["rng_by_rank"]) == 2
    for name, tensor in a["state_dict"].items():
        assert torch.equal(tensor, b["state_dict"][name]), name


STOP_RANK_ONE = """
import os
from lightning.pytorch.callbacks import Callback


class StopRankOne(Callback):
    \"\"\"Ends the second process at the start of epoch 1, as a kill or a lost node would.\"\"\"

    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch == 1 and trainer.global_rank == 1:
            os._exit(1)
"""


def _ddp_fit_losing_a_process(synthetic_data, tiny_cache, tmp_path: Path,
                              callback: str) -> subprocess.CompletedProcess:
    """A 3-epoch DDP fit in ``tmp_path`` with the callback class whose source is ``callback``
    (its one class, which ends a process), run as ``captioner fit`` in a subprocess."""
    name = re.search(r"^class (\w+)", callback, re.MULTILINE).group(1)
    (tmp_path / "losing.py").write_text(callback)
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, *DDP_ON_TWO_CPUS,
                     "--trainer.max_epochs", "3", f"--trainer.callbacks+=losing.{name}")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PL_DISABLE_FORK": "1",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    return subprocess.run([sys.executable, "-m", "captioner.cli", "fit", *args], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.ddp
def test_a_ddp_process_lost_is_told_in_one_line_with_the_resume(synthetic_data, tiny_cache,
                                                                 tmp_path):
    run = _ddp_fit_losing_a_process(synthetic_data, tiny_cache, tmp_path, STOP_RANK_ONE)
    assert run.returncode == 1, run.stderr[-3000:]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    line = run.stderr.strip().splitlines()[-1]
    run_folder = tmp_path / "runs" / "demo_softmax" / "version_0"
    assert line.startswith("captioner fit: another process of this fit stopped ("), line
    assert (f"captioner fit --config {run_folder / 'config.yaml'} --ckpt_path last resumes from "
            f"{run_folder / 'checkpoints' / 'last.ckpt'} (epochs done: 1)") in line
    assert read_epochs_done(run_folder) == 1


KILL_RANK_ONE = """
import os
import signal
import time
from lightning.pytorch.callbacks import Callback


class KillRankOne(Callback):
    \"\"\"At the start of epoch 1 the second process is killed while the first works on its own
    (in no collective that would fail), as a node's out-of-memory killer would.\"\"\"

    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch == 1:
            if trainer.global_rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(12)  # Lightning's observer of the processes looks every 5 s
"""


@pytest.mark.ddp
def test_a_ddp_process_killed_while_the_first_waits_is_told_by_the_first(
        synthetic_data, tiny_cache, tmp_path):
    # Lightning's observer sent SIGKILL to the first process: status 137 and no line at all.
    run = _ddp_fit_losing_a_process(synthetic_data, tiny_cache, tmp_path, KILL_RANK_ONE)
    assert run.returncode == 1, run.stderr[-3000:]
    line = run.stderr.strip().splitlines()[-1]
    run_folder = tmp_path / "runs" / "demo_softmax" / "version_0"
    assert re.fullmatch(
        r"captioner fit: another process of this fit stopped \(local rank 1, pid \d+, was "
        r"killed by SIGKILL\); captioner fit --config " + re.escape(
            f"{run_folder / 'config.yaml'} --ckpt_path last resumes from "
            f"{run_folder / 'checkpoints' / 'last.ckpt'} (epochs done: 1)"), line), line
    assert "Traceback" not in run.stderr


def test_fit_validate_and_test_each_have_their_own_help_line(capsys):
    from captioner.cli import main as cli_main

    assert cli_main(["--help"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()
             if line.startswith("  ")}
    assert "--ckpt_path last resumes" in lines["fit"]
    assert "validation split" in lines["validate"] and "test split" in lines["test"]


def test_float32_matmul_precision_is_set_before_training(synthetic_data, tiny_cache, tmp_path):
    from captioner.training.cli import build_cli

    before = torch.get_float32_matmul_precision()
    try:
        args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--float32_matmul_precision", "high")
        build_cli(args, run=False)
        assert torch.get_float32_matmul_precision() == "high"
        build_cli(_cli_args(synthetic_data, tiny_cache, tmp_path), run=False)
        assert torch.get_float32_matmul_precision() == "highest"  # the default, exact float32
    finally:
        torch.set_float32_matmul_precision(before)


def test_the_configs_of_a_command_line_in_every_spelling(tmp_path):
    from captioner.training.command_line import config_files, first_config, option_values

    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    for path in (first, second):
        path.write_text("model: {}\n")
    args = ["--config", "model: {hidden_dim: 8}", f"-c{first}", "-c", str(second),
            f"--config={second}", f"-c={first}", "--model.hidden_dim", "8"]
    assert config_files(args) == ["model: {hidden_dim: 8}", str(first), str(second),
                                  str(second), str(first)]
    assert option_values(args, "model.hidden_dim") == ["8"]
    assert option_values(["--model.hidden_dim=9", "--print_config"], "model.hidden_dim") == ["9"]
    # The run is named after the first config file: a YAML string names none.
    assert first_config(args) == str(first)
    assert first_config(["--config", "model: {}"]) is None


def test_a_missing_required_setting_is_named_as_its_option(tmp_path, capsys):
    # jsonargparse names it by its place in the parser, "test.data.karpathy_json".
    assert lightning_main(["test", "--ckpt_path", str(tmp_path / "any.ckpt")]) == 2
    assert capsys.readouterr().err == (
        "captioner test: the following arguments are required: --data.karpathy_json, "
        "--data.image_root (or a --config that sets them)\n")


def test_a_config_file_that_is_not_text_is_named(tmp_path, capsys):
    picture = tmp_path / "metrics.png"
    picture.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    assert lightning_main(["test", "--config", str(picture), "--ckpt_path", "best"]) == 2
    assert capsys.readouterr().err == (
        f"captioner test: --config {picture}: not UTF-8 text (invalid start byte at byte 0)\n")


class KilledBeforeLastCheckpoint(Callback):
    """Stops a fit at the end of epoch ``epoch`` as it starts writing last.ckpt, after the best
    checkpoint of that epoch was written (the two are written one after the other at the
    epoch's end): where a ``kill -9`` used to leave a last.ckpt and progress.json naming a
    best checkpoint that had been removed."""

    def __init__(self, epoch: int = 1) -> None:
        self.epoch = epoch
        self.saves = 0

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        if trainer.current_epoch == self.epoch:
            self.saves += 1
            if self.saves == 2:  # the best checkpoint's, then last.ckpt's
                raise RuntimeError("killed")


def test_a_fit_killed_between_its_best_and_last_checkpoints_names_files_that_exist(
    synthetic_data, tiny_cache, tmp_path, capsys
):
    # Without a monitor every validation's checkpoint supersedes the one before.
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--checkpoint.monitor", "null")
    killer = '[{"class_path": "test_training_cli.KilledBeforeLastCheckpoint"}]'
    with pytest.raises(RuntimeError, match="killed"):
        lightning_main(["fit", *args, "--trainer.max_epochs", "3", "--trainer.callbacks", killer])
    folder = tmp_path / "runs" / "demo_softmax" / "version_0" / "checkpoints"
    named = Path(read_progress(folder)["best_checkpoint"])
    assert named.name.startswith("best-epoch00-") and named.is_file()
    states = load_safely(folder / "last.ckpt")["callbacks"]
    best_state = next(state for key, state in states.items() if key.startswith("ModelCheckpoint"))
    assert Path(best_state["best_model_path"]) == named
    # A kill while a checkpoint was written leaves its temporary file, as large as a checkpoint.
    (folder / ".last.ckpt.k9k9k9k9.tmp").write_bytes(b"\0" * 1000)
    (folder / ".notes.tmp").write_text("a file of the user's, not of a write")
    # The resume replays epoch 1 and writes its checkpoint again, not a copy beside it (-v1).
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "3", "--ckpt_path", "last"]) == 0
    assert "removed 1 file of a write that was interrupted: .last.ckpt.k9k9k9k9.tmp" in (
        capsys.readouterr().err)
    assert [path.name for path in folder.glob(".*")] == [".notes.tmp"]
    assert sorted(path.name for path in folder.glob("*.ckpt"))[0].startswith("best-epoch02-")
    assert len(list(folder.glob("*.ckpt"))) == 2 and not list(folder.glob("*-v1.ckpt"))


@pytest.mark.subprocess
def test_a_best_checkpoint_of_an_epoch_the_resume_replays_is_removed(synthetic_data, tiny_cache,
                                                                      tmp_path):
    # Killed as last.ckpt of epoch 1 was being written: epoch 1's best checkpoint exists, and
    # no last.ckpt names it. The resume replays epoch 1; on a GPU, whose kernels are not
    # deterministic, it may score otherwise and be saved under another name (as here, where
    # the resume names its checkpoints otherwise): the file of the epoch done again went on
    # lying beside the run's real best checkpoint.
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--checkpoint.monitor", "null")
    killer = '[{"class_path": "test_training_cli.KilledBeforeLastCheckpoint"}]'
    with pytest.raises(RuntimeError, match="killed"):
        lightning_main(["fit", *args, "--trainer.max_epochs", "3", "--trainer.callbacks", killer])
    folder = tmp_path / "runs" / "demo_softmax" / "version_0" / "checkpoints"
    replayed = next(folder.glob("best-epoch01-*.ckpt"))
    kept = shutil.copy(replayed, folder / "copy-of-epoch01.ckpt")  # the user's: not its own best
    # A child process: the absence of Lightning's warning on stderr is tested.
    code, _, err = _run("fit", *args, "--trainer.max_epochs", "3", "--ckpt_path", "last",
                        "--checkpoint.filename", "again-epoch{epoch:02d}")
    assert code == 0, err[-2000:]
    assert "exists and is not empty" not in err  # a resume writes into its own folders
    assert sorted(path.name for path in folder.glob("*.ckpt")) == [
        "again-epoch02.ckpt", "copy-of-epoch01.ckpt", "last.ckpt"]
    assert Path(kept).is_file()


def test_a_fit_killed_after_its_last_checkpoint_removes_what_it_superseded_on_resume(
    synthetic_data, tiny_cache, tmp_path, monkeypatch
):
    # Killed once last.ckpt is written, before progress.json and the removal of the best
    # checkpoint it supersedes: last.ckpt records that file, which the resume removes.
    import captioner.training.runs as training_runs

    write_progress = training_runs.write_progress

    def killed_at_epoch_2(folder, trainer, last, *, epochs_done):
        if epochs_done == 2:
            raise RuntimeError("killed")
        write_progress(folder, trainer, last, epochs_done=epochs_done)

    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--checkpoint.monitor", "null")
    monkeypatch.setattr(training_runs, "write_progress", killed_at_epoch_2)
    with pytest.raises(RuntimeError, match="killed"):
        lightning_main(["fit", *args, "--trainer.max_epochs", "3"])
    monkeypatch.setattr(training_runs, "write_progress", write_progress)
    folder = tmp_path / "runs" / "demo_softmax" / "version_0" / "checkpoints"
    names = sorted(path.name[:13] for path in folder.glob("best-*.ckpt"))
    assert names == ["best-epoch00-", "best-epoch01-"]
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "3", "--ckpt_path", "last"]) == 0
    left = sorted(path.name[:13] for path in folder.glob("*.ckpt"))
    assert left == ["best-epoch02-", "last.ckpt"]


def test_a_resume_removes_no_file_outside_the_run_that_its_checkpoint_names(
    synthetic_data, tiny_cache, tmp_path
):
    # The superseded checkpoints recorded in last.ckpt are read from an untrusted file.
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--checkpoint.monitor", "null")
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1"]) == 0
    folder = tmp_path / "runs" / "demo_softmax" / "version_0" / "checkpoints"
    victims = [tmp_path / "victim.ckpt", tmp_path / "runs" / "other.ckpt"]
    for victim in victims:
        victim.write_bytes(b"keep me")
    checkpoint = load_safely(folder / "last.ckpt")
    state = next(state for key, state in checkpoint["callbacks"].items()
                 if key.startswith("ModelCheckpoint"))
    state["superseded"] = [str(folder / ".." / ".." / ".." / ".." / "victim.ckpt"),
                           str(victims[1]), "s3://bucket/run/x.ckpt", str(folder / "config.yaml")]
    save_atomically(checkpoint, folder / "last.ckpt")
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "2", "--ckpt_path", "last"]) == 0
    assert all(victim.read_bytes() == b"keep me" for victim in victims)


def test_a_batch_limit_of_1_is_one_batch_and_1_0_all_of_them():
    # Lightning reads an int limit as a number of batches and a float as a fraction of them.
    from jsonargparse import ArgumentParser

    from captioner.training.trainer import Trainer

    parser = ArgumentParser()
    parser.add_class_arguments(Trainer, "trainer")
    for given, meant in (("1", 1), ("1.0", 1.0), ("0.5", 0.5), ("3", 3)):
        limits = parser.parse_args([f"--trainer.limit_{stage}_batches={given}"
                                    for stage in ("train", "val", "test")]).trainer
        for limit in (limits.limit_train_batches, limits.limit_val_batches,
                      limits.limit_test_batches):
            assert limit == meant and type(limit) is type(meant)
    config = parser.parse_string("trainer: {limit_train_batches: 1}")
    assert type(config.trainer.limit_train_batches) is int
