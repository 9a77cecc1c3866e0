"""A checkpoint folder outside the run (--checkpoint.dirpath) belongs to one fit: a second fit
started into it while the first trains is refused in one line, before it trains."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import tiny_fit_args

from captioner.commands.lightning import main as lightning_main
from data_prep.features import FeatureCache
from data_prep.locks import hold_exclusively, let_go

REPO = Path(__file__).resolve().parents[1]


def test_a_second_fit_into_a_checkpoint_folder_in_use_is_refused(synthetic_data, cache32,
                                                                tmp_path, capsys):
    checkpoints = tmp_path / "shared_checkpoints"
    args = ["fit", *tiny_fit_args("demo_sparsemax.yaml", synthetic_data, cache32,
                                  tmp_path / "runs"),
            "--trainer.max_epochs", "1", "--checkpoint.dirpath", str(checkpoints)]
    checkpoints.mkdir()
    first = hold_exclusively(checkpoints)  # a softmax fit training into it now
    try:
        code = lightning_main(args)
    finally:
        let_go(first)
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err[-3000:]
    [line] = [line for line in err.splitlines() if line.startswith("captioner fit: ")]
    assert line == (f"captioner fit: {checkpoints}: another fit is writing its checkpoints "
                    "there now (--checkpoint.dirpath); give this one another folder, or wait "
                    "for it to end"), line
    assert not any(checkpoints.iterdir())
    assert lightning_main(args) == 0  # once the first has ended
    assert (checkpoints / "last.ckpt").is_file()


@pytest.mark.parametrize("limit", ["0", "0.0"])
def test_a_fit_on_no_batch_is_refused_before_its_run_folder_is_made(limit, synthetic_data,
                                                                    cache32, tmp_path,
                                                                    capsys):
    args = [
        "fit", "--config", str(REPO / "configs" / "demo_softmax.yaml"),
        "--data.karpathy_json", str(synthetic_data.karpathy_json),
        "--data.image_root", str(synthetic_data.image_root),
        "--data.feature_cache", str(cache32), "--data.image_size", "32",
        "--model.encoder_weights", FeatureCache(cache32).encoder["weights"],
        "--trainer.limit_train_batches", limit, "--trainer.max_epochs", "1",
        "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"),
    ]
    assert lightning_main(args) == 2
    err = capsys.readouterr().err
    [line] = [line for line in err.splitlines() if line.startswith("captioner fit: ")]
    assert line == ("captioner fit: --trainer.limit_train_batches 0 trains on no batch, so "
                    "the fit would save no checkpoint; give 1 or more batches, or a fraction "
                    "above 0"), err[-2000:]
    assert not (tmp_path / "runs").exists()
