"""captioner.commands.options.function_parser: a command's options from a library function's
signature and docstring, read from the command line or a --config file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from captioner.commands.options import arguments_of, function_parser


def work(inputs: list[Path], out: Path, count: int = 3, progress: bool = True,
         name: str | None = None) -> dict:
    """Do the work.

    Args:
        inputs: files to read; repeat the option for each.
        out: file to write.
        count: how many times.
        progress: show progress bars.
        name: what to call it.
    """
    return {"inputs": inputs, "out": out, "count": count, "progress": progress, "name": name}


def _parser():
    return function_parser("captioner work", "``captioner work``: the work.", work,
                           once=("out",))


def _refused(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        _parser().parse_args(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("captioner work: error: ") and err.count("\n") == 1, err
    return err


def test_options_spelled_with_dashes_repeated_lists_and_flags():
    args = _parser().parse_args(["--inputs", "a", "--inputs=b", "--out", "o", "--no-progress",
                                 "--count", "4", "--count", "5"])  # the last count holds
    assert work(**arguments_of(work, args)) == {
        "inputs": [Path("a"), Path("b")], "out": Path("o"), "count": 5, "progress": False,
        "name": None}


def test_help_comes_from_the_docstring_without_markup(capsys):
    with pytest.raises(SystemExit) as stop:
        _parser().parse_args(["--help"])
    assert stop.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "captioner work: the work." in text and "``" not in text
    for option, help_text in (("--out OUT", "file to write."), ("--count COUNT", "how many"),
                              ("--progress, --no_progress", "show progress bars."),
                              ("--config CONFIG", "YAML file of options")):
        assert f"{option} {help_text}" in text, option


def test_a_config_written_by_print_config_reads_back(tmp_path, capsys):
    with pytest.raises(SystemExit):
        _parser().parse_args(["--inputs", "a", "--out", "o", "--count", "7", "--print_config"])
    config = tmp_path / "c.yaml"
    config.write_text(capsys.readouterr().out)
    args = _parser().parse_args(["--config", str(config), "--name", "x"])
    assert (args.inputs, args.out, args.count, args.name) == ([Path("a")], Path("o"), 7, "x")


def test_usage_errors_are_one_line(tmp_path, capsys):
    assert "--out is given twice (a and b); give it once" in _refused(
        ["--inputs", "i", "--out", "a", "--out", "b"], capsys)
    assert "--count: invalid value x (expected int)" in _refused(
        ["--inputs", "i", "--out", "o", "--count", "x"], capsys)
    assert "unrecognized arguments: --no_such" in _refused(
        ["--inputs", "i", "--out", "o", "--no-such"], capsys)
    broken = tmp_path / "broken.yaml"
    broken.write_text("count: [1\n")
    assert f"--config {broken}: Problems parsing config: " in _refused(["--config", str(broken)],
                                                                     capsys)


def test_a_file_name_that_is_not_utf8_is_read_as_it_is():
    name = os.fsdecode(b"caf\xe9.json")
    args = _parser().parse_args(["--inputs", name, "--out", name])
    assert args.inputs == [Path(name)] and args.out == Path(name)


def test_usage_checks_after_parsing_are_one_line(capsys):
    parser = _parser()

    def refuse(value):
        raise ValueError(f"cannot use {value}")

    with pytest.raises(SystemExit) as stop:
        parser.check(refuse, "this")
    assert stop.value.code == 2
    assert capsys.readouterr().err == "captioner work: error: cannot use this\n"


@pytest.mark.parametrize("command", ["captioner.commands.caption", "captioner.commands.heatmaps",
                                     "eval.commands.gallery"])
def test_an_empty_image_path_is_refused_not_read_as_this_folder(command, capsys):
    # Path("") is the current folder: every image below it would be captioned.
    import importlib

    parser = importlib.import_module(command).build_parser()
    with pytest.raises(SystemExit) as stop:
        parser.parse_args(["photo.jpg", "", "--ckpt", "x.ckpt", "--out", "out"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1, err
    assert err.endswith("error: argument IMAGE_OR_DIR: an empty path (an unset shell "
                        "variable?); give '.' for this folder\n")
    assert parser.parse_args(["photo.jpg", ".", "--ckpt", "x.ckpt", "--out", "out"]).inputs[1] \
        == Path(".")
