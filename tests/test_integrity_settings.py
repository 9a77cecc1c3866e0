"""Settings files read as data share one loader and its limits (size, YAML aliases, nesting):
fit's --config, and a run folder's config.yaml and progress.json that ``captioner runs``
reads; a checkpoint path no file can have in a progress.json is no run's progress."""

from __future__ import annotations

import pytest
import robust_inputs as bad

from data_prep.settings_files import SettingsLimitError, read_settings

# 10 levels of 10 aliases each: 10**10 values once expanded, from 500 bytes.
ALIAS_BOMB = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 10))


ROWS = {
    # The bomb where `runs` shows a value (the output mapping's keywords): shown, it would be
    # expanded to 10**10 words.
    "alias bomb in config.yaml": (
        ALIAS_BOMB + "model:\n  input_attention: softmax\n  output_attention: tvmax\n"
        "  output_attention_kwargs:\n    lam: *a9\n", None),
    "100,000 nested [ in config.yaml": ("[" * 100_000, None),
    "10-million-character path in progress.json": (None, {
        "epochs_done": 1, "global_step": 2, "monitor": "val/CIDEr", "best_score": 0.5,
        "best_checkpoint": "/" + "a" * 10_000_000, "last_checkpoint": "/" + "b" * 300}),
}


@pytest.mark.parametrize("name", list(ROWS))
def test_runs_lists_a_run_folder_with_hostile_files_without_a_traceback(name, tmp_path, capsys):
    config, progress = ROWS[name]
    bad.run_folder_holding(tmp_path, config, progress)
    outcome = bad.run_cli(capsys, ["runs", "--root", tmp_path], seconds=30)
    assert outcome.code == 0, outcome.err[-2000:]
    assert "Traceback" not in outcome.err
    [line] = [line for line in outcome.out.splitlines() if line.startswith("demo ")]
    assert "version_0" in line and len(line) < 400, line[:400]


@pytest.mark.parametrize(("text", "phrase"), [
    ("[" * 100_000, "nested more than 64 levels deep; a config holds settings"),
    ("".join(f"{'  ' * i}k{i}:\n" for i in range(80)) + "  " * 80 + "1\n",
     "nested more than 64 levels deep; a config holds settings"),
    ("x: " + "y" * (1 << 20) + "\n", "larger than 1,048,576 bytes; a config holds settings"),
], ids=["100,000 nested [", "80 nested mappings", "over 1 MiB"])
def test_fit_refuses_a_config_past_the_limits_in_one_line(text, phrase, tmp_path, capsys):
    config = tmp_path / "deep.yaml"
    config.write_text(text, encoding="utf-8")
    outcome = bad.run_cli(capsys, ["fit", "--config", config], seconds=60)
    bad.assert_user_error(outcome, "fit", f"--config {config}: ", phrase)


def test_the_shared_loader_counts_aliases_and_depth_without_recursing(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(ALIAS_BOMB, encoding="utf-8")
    with pytest.raises(SettingsLimitError, match="expand to more than 100,000 values"):
        read_settings(bomb)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 70 + "]" * 70, encoding="utf-8")
    with pytest.raises(SettingsLimitError, match="nested more than 64 levels"):
        read_settings(deep)
    fine = tmp_path / "fine.yaml"
    fine.write_text("a: &x [1, 2]\nb: *x\nc: {d: [[[1]]]}\n", encoding="utf-8")
    assert read_settings(fine) == {"a": [1, 2], "b": [1, 2], "c": {"d": [[[1]]]}}


@pytest.mark.parametrize("text", ["", "# settings to come\n"], ids=["empty", "only a comment"])
def test_fit_names_a_config_that_holds_no_settings(text, tmp_path, capsys):
    base = tmp_path / "base.yaml"
    base.write_text("trainer:\n  max_epochs: 1\n", encoding="utf-8")
    empty = tmp_path / "second.yaml"
    empty.write_text(text, encoding="utf-8")
    outcome = bad.run_cli(capsys, ["fit", "--config", base, "--config", empty])
    bad.assert_user_error(outcome, "fit", f"--config {empty}: holds no settings")
