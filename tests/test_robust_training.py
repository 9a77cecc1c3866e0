"""Robustness table of ``captioner fit|test --ckpt_path FILE``: one row per bad checkpoint.

Rules checked: a checkpoint that cannot be used is one line ``captioner fit|test: ...`` naming
the file and the problem, exit 2, no traceback, nothing trained or written; a checkpoint that
would run code is refused without running it and without suggesting weights_only=False;
nothing hangs on a FIFO.

Covered elsewhere (not repeated): a checkpoint whose hyperparameters hold a class_path, a
missing file, 'last' without a run and earlier versions' checkpoints
(tests/test_training_cli.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import robust_inputs as bad

REPO = Path(__file__).resolve().parents[1]
NOT_FOUND = "an existing {} given as --ckpt_path is reported as 'no such checkpoint file'"
FOREIGN = ("a torch file without Lightning's keys passes the --ckpt_path check and fails "
           "inside Lightning: KeyError 'pytorch-lightning_version', traceback, exit 1")


def _args(dataset, out: Path) -> list:
    """A small demo_softmax run on the synthetic images (no feature cache, random encoder)."""
    return [
        "--config", REPO / "configs" / "demo_softmax.yaml",
        "--data.karpathy_json", dataset.karpathy_json,
        "--data.image_root", dataset.image_root,
        "--data.feature_cache", "null", "--data.image_size", "128",
        "--data.batch_size", "4", "--data.eval_batch_size", "4",
        "--model.encoder_weights", "null",
        "--model.hidden_dim", "32", "--model.feature_dim", "32", "--model.embed_dim", "16",
        "--model.decoding.max_length", "4", "--model.decoding.beam_size", "1",
        "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "1",
        "--trainer.limit_val_batches", "1", "--trainer.limit_test_batches", "1",
        "--trainer.enable_progress_bar", "false",
        "--trainer.logger.init_args.save_dir", out / "runs",
    ]


@pytest.fixture(scope="module")
def bad_checkpoints(tiny_checkpoint, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bad_checkpoints")
    rows = bad.checkpoint_rows(folder, tiny_checkpoint)
    rows["FIFO"] = (bad.write_fifo(folder / "pipe.ckpt"), "FIFO")
    return rows


def _checked(outcome, command: str, ckpt: Path, phrase: str, out: Path) -> None:
    bad.assert_user_error(outcome, command, str(ckpt), phrase)
    assert "weights_only" not in outcome.err
    assert not (ckpt.parent / "EXECUTED").exists()
    assert not list(out.rglob("*.ckpt")), "nothing may be trained"


@pytest.mark.parametrize(
    ("command", "name"),
    [
        ("test", "empty file"),
        ("fit", "empty file"),
        pytest.param("test", "folder"),
        pytest.param("test", "FIFO"),
        pytest.param("test", "foreign state_dict"),
        ("test", "NaN weights"),
        ("test", "no Lightning version"),
        ("fit", "no optimizer state"),
    ],
)
def test_unusable_checkpoint_is_one_line_in_process(
    command, name, bad_checkpoints, synthetic_data, tmp_path, capsys
):
    ckpt, phrase = bad_checkpoints[name]
    argv = [command, *_args(synthetic_data, tmp_path), "--ckpt_path", ckpt]
    outcome = bad.run_cli(capsys, argv, seconds=120, fifos=(ckpt,))
    _checked(outcome, command, ckpt, phrase, tmp_path)


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("command", "name"),
    [
        ("test", "malicious pickle"),
        pytest.param("fit", "foreign state_dict"),
    ],
)
def test_unusable_checkpoint_is_one_line_from_the_console_script(
    command, name, bad_checkpoints, synthetic_data, tmp_path
):
    ckpt, phrase = bad_checkpoints[name]
    argv = [command, *_args(synthetic_data, tmp_path), "--ckpt_path", ckpt]
    outcome = bad.run_subprocess(argv, cwd=tmp_path, seconds=240)
    _checked(outcome, command, ckpt, phrase, tmp_path)



@pytest.fixture(scope="module")
def resumable(synthetic_data, tmp_path_factory) -> tuple[list, Path]:
    """The arguments of a one-epoch fit (:func:`_args`) and the last.ckpt it wrote."""
    out = tmp_path_factory.mktemp("resumable")
    args = _args(synthetic_data, out)
    outcome = bad.run_subprocess(["fit", *args], cwd=out, seconds=240)
    assert outcome.code == 0, outcome.err[-3000:]
    return args, next((out / "runs").rglob("last.ckpt"))


def _first_adam_moment(checkpoint: dict, value) -> None:
    entry = next(iter(checkpoint["optimizer_states"][0]["state"].values()))
    entry["exp_avg"] = value(entry["exp_avg"])


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("alter", "phrase"),
    [
        # torch loads moments of any shape, then fails at the first step in a traceback.
        (lambda c: _first_adam_moment(c, lambda m: m.new_zeros(m.numel() + 1)),
         "optimizer state cannot resume this model: 'exp_avg' of model."),
        # A NaN moment would make every weight it updates NaN.
        (lambda c: _first_adam_moment(c, lambda m: m.new_full(m.shape, float("nan"))),
         "holds NaN or inf"),
        (lambda c: c["optimizer_states"][0]["param_groups"][0]["params"].pop(),
         "optimizer state cannot resume this model: it holds the state of"),
    ],
    ids=["reshaped moment", "NaN moment", "one parameter fewer"],
)
def test_an_optimizer_state_that_cannot_resume_the_model_is_one_line(
    alter, phrase, resumable, tmp_path
):
    args, last = resumable
    ckpt = bad.write_altered_checkpoint(last, tmp_path / "altered.ckpt", alter)
    runs = sorted(last.parents[3].rglob("*"))
    outcome = bad.run_subprocess(["fit", *args, "--trainer.max_epochs", "2", "--ckpt_path", ckpt],
                                 cwd=tmp_path, seconds=240)
    bad.assert_user_error(outcome, "fit", str(ckpt), phrase)
    assert sorted(last.parents[3].rglob("*")) == runs  # the run is as the first fit left it
