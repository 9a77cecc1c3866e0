"""``captioner test --run_name R --ckpt_path best`` (and validate) take everything else from the
run's own config.yaml: nothing given to the fit is given again."""

from __future__ import annotations

import csv

from test_training_cli import _cli_args, tiny_cache  # noqa: F401 (tiny_cache: a fixture)

from captioner.commands.lightning import main as lightning_main


def _scores(metrics) -> dict[str, str]:
    with metrics.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    return {key: value for row in rows for key, value in row.items() if value}


def test_test_and_validate_of_a_run_by_its_name_need_no_other_option(
        synthetic_data, tiny_cache, tmp_path, capsys):  # noqa: F811
    runs = tmp_path / "runs"
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--run_name", "mine",
                     "--trainer.max_epochs", "1")
    assert lightning_main(["fit", *args]) == 0, capsys.readouterr().err
    run = runs / "mine" / "version_0"
    # The runs folder is the only option besides the name, as the fit was given its own.
    where = ["--trainer.logger.init_args.save_dir", str(runs)]
    assert lightning_main(["test", "--run_name", "mine", "--ckpt_path", "best", *where]) == 0, (
        capsys.readouterr().err)
    assert "test/CIDEr" in _scores(run / "test" / "metrics.csv")
    assert lightning_main(["validate", "--run_name", "mine", "--ckpt_path", "last",
                           *where]) == 0, capsys.readouterr().err
    assert "val/CIDEr" in _scores(run / "validate" / "metrics.csv")
    # Same scores as the test given the run's config.yaml, the form that worked before.
    assert lightning_main(["test", "--config", str(run / "config.yaml"), "--ckpt_path",
                           "best"]) == 0
    first, again = (_scores(run / name / "metrics.csv") for name in ("test", "test_2"))
    assert first["test/CIDEr"] == again["test/CIDEr"]


def test_a_run_name_without_a_run_is_still_one_line(tmp_path, capsys):
    code = lightning_main(["test", "--run_name", "none_such", "--ckpt_path", "best",
                           "--trainer.logger.init_args.save_dir", str(tmp_path / "runs")])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("captioner test: ") and "Traceback" not in err
