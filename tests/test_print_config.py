"""Every command takes ``--config FILE`` and ``--print_config``: the config that
``--print_config`` writes reads back with ``--config`` to the same options (``captioner runs``
and each benchmark of ``captioner bench``, in this process)."""

from __future__ import annotations

import functools
import importlib
import json
import sys
from pathlib import Path
from unittest import mock

import pytest
import yaml

from captioner.cli import _commands
from captioner.cli import main as captioner
from captioner.commands import bench

BENCHMARKS = ("attention", "model", "fit", "page")


def _command_lines() -> list[list[str]]:
    """Each command of ``captioner --help`` (bench: each of its benchmarks)."""
    lines = []
    for command in sorted(_commands()):
        lines += [["bench", name] for name in BENCHMARKS] if command == "bench" else [[command]]
    return lines


def _printed_config(argv: list[str], capsys) -> str:
    """What ``captioner ARGV --print_config`` writes on stdout; it exits with status 0."""
    # The command line of pytest is not the command's (LightningCLI reads sys.argv too).
    with pytest.raises(SystemExit) as stopped, mock.patch.object(sys, "argv", ["captioner"]):
        captioner([*argv, "--print_config"])
    assert stopped.value.code in (0, None)
    return capsys.readouterr().out


def test_every_command_is_listed_here():
    assert "bench" in _commands() and "runs" in _commands() and len(_command_lines()) > 15


@pytest.mark.parametrize("argv", _command_lines(), ids=" ".join)
def test_every_command_prints_its_config(argv, capsys):
    config = yaml.safe_load(_printed_config(argv, capsys))
    assert isinstance(config, dict) and config, argv


def test_a_runs_config_lists_the_same_runs(tmp_path, capsys):
    """``runs --root R --print_config > c.yaml && runs --config c.yaml``."""
    root = tmp_path / "elsewhere"
    checkpoints = root / "coco_tvmax" / "version_0" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "last.ckpt").write_bytes(b"")
    config = tmp_path / "runs.yaml"
    config.write_text(_printed_config(["runs", "--root", str(root)], capsys))
    assert yaml.safe_load(config.read_text()) == {"root": str(root)}
    assert captioner(["runs", "--config", str(config)]) == 0
    from_config = capsys.readouterr().out
    assert captioner(["runs", "--root", str(root)]) == 0
    assert capsys.readouterr().out == from_config
    assert "coco_tvmax" in from_config and "checkpoints: last.ckpt" in from_config


# Options other than the defaults, spelled as users type them (dashes), and the smallest sizes.
OPTIONS = {
    "attention": ["--repeats", "2", "--threads", "1", "--scores", "smooth", "--clock", "cpu",
                  "--seed", "3"],
    "model": ["--mappings", "softmax,sparsemax", "--batch-size", "1", "--grid", "1",
              "--channels", "1", "--vocab-size", "5", "--caption-length", "2", "--beam-size", "1",
              "--max-length", "1", "--repeats", "1", "--warmup", "0", "--threads", "1",
              "--lam", "0.5", "--clock", "cpu"],
    "fit": ["--mappings", "softmax", "--images", "2", "--grid", "1", "--vocab-size", "5",
            "--batch-size", "1", "--steps", "2", "--warmup-steps", "1", "--num-workers", "0",
            "--preload-features", "true", "--precision", "32", "--accelerator", "cpu"],
    "page": ["docs/benchmarks.md"],
}


@pytest.mark.parametrize("name", BENCHMARKS)
def test_a_benchmark_config_gives_the_same_options(name, tmp_path, capsys, monkeypatch):
    """``bench NAME ... --print_config > c.yaml && bench NAME --config c.yaml`` runs the
    benchmark with the options of the command line (recorded, not timed)."""
    module = importlib.import_module(f"captioner.benchmarks.{name}")
    ran = []

    @functools.wraps(module.benchmark)  # its signature, which the command reads
    def record(**options) -> int:
        ran.append({key: value for key, value in options.items() if key != "run"})
        return 0

    monkeypatch.setattr(module, "benchmark", record)
    argv = OPTIONS[name] + (["--markdown", str(tmp_path / "table.md")] if name != "page" else [])
    if name == "page":
        argv = [str(Path(__file__).resolve().parents[1] / argv[0])]
    config = tmp_path / f"{name}.yaml"
    config.write_text(_printed_config(["bench", name, *argv], capsys))
    assert bench.main([name, "--config", str(config)]) == 0
    assert bench.main([name, *argv]) == 0
    assert len(ran) == 2 and ran[0] == ran[1]
    given = {word[2:].replace("-", "_") for word in argv if word.startswith("--")}
    assert given <= set(ran[0]), given - set(ran[0])  # every option given reached it


def test_a_tiny_model_benchmark_runs_from_its_config(tmp_path, capsys):
    results = tmp_path / "bench.json"
    config = tmp_path / "model.yaml"
    config.write_text(_printed_config(["bench", "model", *OPTIONS["model"], "--json",
                                       str(results)], capsys))
    assert bench.main(["model", "--config", str(config)]) == 0
    assert "batch 1, grid 1x1x1, vocab 5" in capsys.readouterr().out
    assert set(json.loads(results.read_text())) == {"softmax", "sparsemax"}
