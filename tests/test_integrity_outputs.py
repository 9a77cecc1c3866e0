"""An output folder (or file) belongs to one run: a second writer is refused in one line
before any work and nothing of the first's is touched; a killed run's staging folder does not
block the rerun, which removes it."""

from __future__ import annotations

import pytest
import robust_inputs as bad

from data_prep.locks import held_alone
from data_prep.output_folders import STAGING_PREFIX, output_lock_path

FAST = ["--beam-size", "1", "--max-length", "4", "--no-progress", "--device", "cpu"]
WHAT = {"gallery": "gallery", "rating-kit": "rating kit", "heatmaps": "heatmaps",
        "caption": "captions"}


def _argv(command, photos, out, ckpt):
    if command == "rating-kit":
        return ["rating-kit", photos, "--ckpt", ckpt, "--out", out, "--n", "2", *FAST]
    return [command, photos, "--ckpt", ckpt, "--out", out, *FAST]


def _photos(folder):
    folder.mkdir()
    for seed in range(2):
        bad.write_png(folder / f"p{seed}.png", seed=seed)
    return folder


@pytest.mark.parametrize("command", list(WHAT))
def test_a_second_run_into_the_same_out_is_refused_and_touches_nothing(
        command, tiny_checkpoint, tmp_path, capsys):
    photos = _photos(tmp_path / "photos")
    out = tmp_path / ("captions.txt" if command == "caption" else "out")
    if command != "caption":
        out.mkdir()
        (out / ".partial-first").mkdir()  # the first run at work, in its staging folder
        (out / ".partial-first" / "index.html").write_text("the first run's page")
    busy = f"another run is writing its {WHAT[command]} there now"
    with held_alone(output_lock_path(out), "held by the first run"):  # the first run
        before = bad.names_under(tmp_path)
        outcome = bad.run_cli(capsys, _argv(command, photos, out, tiny_checkpoint))
        bad.assert_user_error(outcome, command, str(out), busy, str(output_lock_path(out)))
        assert bad.names_under(tmp_path) == before
    assert not output_lock_path(out).exists()


@pytest.mark.parametrize("command", ["gallery", "rating-kit", "heatmaps"])
def test_a_killed_runs_staging_folder_does_not_block_the_rerun(command, tiny_checkpoint,
                                                              tmp_path, capsys):
    photos = _photos(tmp_path / "photos")
    out = tmp_path / "out"
    staging = out / f"{STAGING_PREFIX}k1ll3d"  # what a run killed with SIGKILL leaves
    (staging / "p0").mkdir(parents=True)
    (staging / "p0" / "strip.png").write_bytes(b"half a figure")
    outcome = bad.run_cli(capsys, _argv(command, photos, out, tiny_checkpoint))
    assert outcome.code == 0, outcome.err[-2000:]
    assert not staging.exists()
    assert not [name for name in bad.names_under(out) if STAGING_PREFIX in name]
    assert not output_lock_path(out).exists()
