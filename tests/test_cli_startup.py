"""The CLI starts at once: the usage, the options of the commands and ``runs`` import none of the
heavy libraries (torch, Lightning, numba, ...), which take seconds to import.

Counted by the modules a fresh interpreter holds after the command, not by wall time, which
depends on the machine and its load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# What the options and listings must not need: each takes from 0.3 s (matplotlib) to
# several seconds (torch with Lightning) to import. (pycocoevalcap's package is light: SPICE's
# jars are found beside its ``spice`` module; its scorers are imported where they score.)
HEAVY = ("torch", "lightning", "numba", "torchvision", "h5py", "matplotlib",
         "pycocoevalcap.bleu", "pycocoevalcap.meteor", "pycocoevalcap.tokenizer")
# fit, validate and test print LightningCLI's options, which only Lightning knows.
LIGHTNING_COMMANDS = {"fit", "validate", "test"}


def _imported_after(argv: list[str], cwd: Path = ROOT) -> tuple[int, str, list[str]]:
    """Run ``captioner.cli.main(argv)`` in a fresh interpreter: (its status, its output, the
    heavy libraries it left imported)."""
    code = (
        "import contextlib, io, json, sys\n"
        "import captioner.cli\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    try:\n"
        f"        code = captioner.cli.main({argv!r})\n"
        "    except SystemExit as exc:\n"
        "        code = exc.code\n"
        f"heavy = [name for name in {HEAVY!r} if name in sys.modules]\n"
        "print(json.dumps([code, out.getvalue(), heavy]))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=120, check=True)
    return tuple(json.loads(done.stdout.splitlines()[-1]))


def _commands() -> list[str]:
    from importlib.metadata import entry_points

    return sorted(ep.name for ep in entry_points(group="captioner.commands"))


def test_usage_imports_no_heavy_library():
    code, out, heavy = _imported_after(["--help"])
    assert code == 0
    assert heavy == []
    # Every command's line is there, read from its module's source.
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert sorted(lines) == _commands()
    assert "(unavailable" not in out
    assert "train a captioner from YAML configs" in lines["fit"]
    assert "score a checkpoint on the test split" in lines["test"]


@pytest.mark.parametrize("command", [c for c in _commands() if c not in LIGHTNING_COMMANDS])
def test_command_options_import_no_heavy_library(command):
    code, out, heavy = _imported_after([command, "--help"])
    assert code == 0
    assert f"captioner {command}" in out  # the command's own usage, not the CLI's
    assert heavy == []


def _write_run(root: Path) -> Path:
    """A run as fit leaves it: config.yaml, and progress.json beside its checkpoints."""
    folder = root / "cpu_small_tvmax" / "version_0"
    checkpoints = folder / "checkpoints"
    checkpoints.mkdir(parents=True)
    (folder / "config.yaml").write_text(
        "model:\n  input_attention: softmax\n  output_attention: tvmax\n", encoding="utf-8")
    best = checkpoints / "epoch=2-step=30.ckpt"
    last = checkpoints / "last.ckpt"
    best.write_bytes(b"")
    last.write_bytes(b"")
    (checkpoints / "progress.json").write_text(json.dumps({
        "epochs_done": 3, "global_step": 30, "monitor": "val/CIDEr", "best_score": 0.25,
        "best_checkpoint": str(best), "last_checkpoint": str(last)}), encoding="utf-8")
    return folder


def test_runs_lists_without_torch_or_lightning(tmp_path):
    folder = _write_run(tmp_path / "runs")
    code, out, heavy = _imported_after(["runs", "--root", str(tmp_path / "runs")])
    assert code == 0
    assert heavy == []
    row = out.splitlines()[1].split()
    assert row[:6] == ["cpu_small_tvmax", "version_0", "softmax/tvmax", "3", "30", "CIDEr"]
    assert row[6] == "0.2500"
    assert str(folder / "checkpoints" / "last.ckpt") in out


def test_checkpoint_files_and_devices_need_no_lightning():
    # caption and prepare-features read and write checkpoints and pick their device; Lightning's
    # checkpoint plugin, which run folders' config.yaml still name as
    # captioner.checkpointing.AtomicCheckpointIO, is imported only when that name is asked for.
    code = ("import sys\n"
            "import captioner.checkpointing as checkpointing\n"
            "from captioner.model.devices import resolve_device\n"
            "resolve_device('cpu')\n"
            "print('lightning' in sys.modules)\n"
            "plugin = checkpointing.AtomicCheckpointIO\n"
            "print('lightning' in sys.modules, plugin.__name__)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=120, check=True)
    assert done.stdout.split() == ["False", "True", "AtomicCheckpointIO"]


def _lightning_modules_after(code: str) -> tuple[str, list[str]]:
    """Run ``code`` (which prints one line) in a fresh interpreter: (that line, the modules
    named ``lightning*`` it left imported)."""
    code += ("import sys\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0].startswith('lightning')))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300, check=True)
    *_, printed, modules = done.stdout.splitlines()
    return printed, json.loads(modules.replace("'", '"'))


@pytest.mark.subprocess  # a child that imports torch and captions
def test_captioning_with_a_checkpoint_imports_no_lightning(tiny_checkpoint, synthetic_data):
    # caption, heatmaps, gallery, rating-kit and evaluate load a trained model: plain torch,
    # as the LightningModule that trained it builds and decodes it.
    image = sorted((synthetic_data.image_root / "test").glob("*.png"))[0]
    code = ("from captioner.inference.pipeline import open_captioner\n"
            f"captioner = open_captioner({str(tiny_checkpoint)!r}, 'cpu')\n"
            f"[caption] = captioner.caption([{str(image)!r}])\n"
            "print(len(caption.tokens), tuple(caption.attention.shape[1:]))\n")
    printed, modules = _lightning_modules_after(code)
    assert modules == []
    words, grid = printed.split(" ", 1)
    assert int(words) >= 1 and grid == "(4, 4)"


@pytest.mark.subprocess
def test_the_caption_command_imports_no_lightning(tiny_checkpoint, synthetic_data):
    image = sorted((synthetic_data.image_root / "test").glob("*.png"))[0]
    code, out, heavy = _imported_after(["caption", str(image), "--ckpt", str(tiny_checkpoint),
                                        "--device", "cpu"])
    assert code == 0
    assert image.name in out
    assert "torch" in heavy and "lightning" not in heavy
