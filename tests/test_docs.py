"""The README and docs/ stay true: no commit hashes in their prose, a README short enough to
read, links that resolve, and every shell block either run by a test or marked as needing what
the machine lacks (COCO, a GPU, the network, ...), with every option of its ``captioner``
commands one that the command takes; Python examples that run; and docs/benchmarks.md, which
``captioner bench page`` regenerates changing only figures.

A shell block (```bash, ```sh, ```console or ```shell) is preceded by an HTML comment, which
a rendered page does not show:

* ``<!-- needs: WHAT ... -->``: not run here, as it needs one of :data:`NEEDS`;
* ``<!-- run: tests/test_X.py -->``: that test runs it (the test file must hold every option
  the block gives, as it spells them in its own commands);
* none: :func:`test_an_unmarked_shell_block_runs` runs it in an empty folder, with
  ``captioner`` being this checkout's.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 200
NEEDS = {
    "coco": "the COCO or Flickr30k images and split files",
    "gpu": "a CUDA device",
    "network": "a download (pip, Maven Central, torchvision weights)",
    "root": "root for apt-get",
    "java": "a Java runtime",
    "own-data": "the reader's own photos or checkpoints",
    "time": "more than a few minutes (the demo, the test suite, the benchmarks)",
}
SHELLS = {"bash", "sh", "console", "shell"}
# Hex strings that are not commits: each with what it is.
NOT_COMMITS = {
    "cd907fc2": "the SHA-256 prefix in the name of torchvision's ResNet-101 weights file",
}
HEX_RUN = re.compile(r"(?<![0-9A-Za-z])[0-9a-fA-F]{7,40}(?![0-9A-Za-z])")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
MARKER = re.compile(r"^<!--\s*(needs|run):\s*(.*?)\s*-->$")


@dataclass(frozen=True)
class ShellBlock:
    page: Path
    line: int  # 1-based line of the opening fence
    text: str
    marker: tuple[str, str] | None  # ("needs", "coco gpu") or ("run", "tests/test_x.py")

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def shell_blocks(page: Path) -> list[ShellBlock]:
    """The fenced shell blocks of ``page``, each with the marker comment above it (blank lines
    between them allowed)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, index = [], 0
    while index < len(lines):
        fence = re.match(r"^```\s*(\S*)", lines[index])
        if not fence:
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
        if fence[1] in SHELLS:
            above = next((lines[i].strip() for i in range(index - 1, -1, -1)
                          if lines[i].strip()), "")
            marker = MARKER.match(above)
            blocks.append(ShellBlock(page, index + 1, "\n".join(lines[index + 1:end]),
                                     (marker[1], marker[2]) if marker else None))
        index = end + 1
    return blocks


BLOCKS = [block for page in PAGES for block in shell_blocks(page)]


def commands(block_text: str) -> list[list[str]]:
    """The ``captioner`` commands of a shell block as argument lists (from ``captioner``'s
    sub-command on): continuation lines joined, comments, environment assignments and the
    other commands of a line (``&&``, ``;``, ``|``) left out."""
    found = []
    for line in block_text.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        segment: list[str] = []
        for word in [*words, ";"]:
            if word in ("&&", ";", "|", "||"):
                while segment and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", segment[0]):
                    segment.pop(0)
                if segment[:1] == ["captioner"]:
                    found.append(segment[1:])
                segment = []
            else:
                segment.append(word)
    return found


@functools.cache
def options_of(command: tuple[str, ...]) -> frozenset[str]:
    """The long options that ``captioner COMMAND --help`` lists (COMMAND: a sub-command, or
    ``bench NAME``), from the help run in this process."""
    from captioner.cli import main

    out = io.StringIO()
    # The command line of pytest is not the command's (LightningCLI warns when both exist).
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit), \
            mock.patch.object(sys, "argv", ["captioner"]):
        main([*command, "--help"])
    return frozenset(re.findall(r"--[A-Za-z0-9][A-Za-z0-9_.-]*", out.getvalue()))


def sub_command(argv: list[str]) -> tuple[str, ...]:
    return tuple(argv[:2]) if argv[:1] == ["bench"] and len(argv) > 1 else tuple(argv[:1])


def given_options(argv: list[str]) -> list[str]:
    return [word.split("=", 1)[0] for word in argv if word.startswith("--") and word != "--"]


@functools.cache
def takes_dashes(command: tuple[str, ...]) -> bool:
    """Whether ``captioner COMMAND`` (or ``bench NAME``) reads its options with FunctionParser,
    which takes ``--image-size`` for the ``--image_size`` its help lists."""
    from captioner.cli import _commands
    from captioner.commands.options import FunctionParser

    module = importlib.import_module(_commands()[command[0]])
    build_parser = getattr(module, "build_parser", None)
    return build_parser is not None and isinstance(build_parser(*command[1:]), FunctionParser)


def as_parsed(command: tuple[str, ...], option: str) -> str:
    """``option`` as the help of ``command`` lists it."""
    return "--" + option[2:].replace("-", "_") if takes_dashes(command) else option


def known(option: str, listed: frozenset[str]) -> bool:
    """Whether ``option`` is listed, or extends a listed option with ``.`` (jsonargparse lists
    ``--trainer.logger`` for ``--trainer.logger.init_args.version``)."""
    parts = option.split(".")
    return any(".".join(parts[:n]) in listed for n in range(len(parts), 0, -1))


def commit_like(text: str) -> list[str]:
    """The runs of 7 to 40 hex digits in ``text`` that hold a digit and a letter (as a commit
    hash does, and words and numbers do not), but those of :data:`NOT_COMMITS`."""
    return [run for run in HEX_RUN.findall(text)
            if re.search(r"[0-9]", run) and re.search(r"[a-fA-F]", run)
            and run.lower() not in NOT_COMMITS]


def test_no_commit_hash_in_readme_or_docs():
    found = [f"{page.relative_to(ROOT)}:{number}: {run}"
             for page in PAGES
             for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
             for run in commit_like(line)]
    assert not found, "commit hashes (history lives in git):\n" + "\n".join(found)


def test_the_commit_hash_check_finds_hashes_and_passes_words_numbers_and_known_hex():
    assert commit_like("fixed at 0b746b0 (see DEADBEEF01), in resnet101-cd907fc2.pth; not "
                       "2002.05556, 1234567, effaced or a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c"
                       ) == ["0b746b0", "DEADBEEF01"]


def test_the_readme_is_short_and_starts_with_install_and_the_first_command():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"
    head = "\n".join(lines[:30])
    assert "pip install -e ." in head and "captioner demo" in head and "bash .ci/run" in head


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but ``-`` and ``_`` dropped,
    spaces as ``-``."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {slug(match[1]) for match in re.finditer(r"^#{1,6}\s+(.+)$", text, re.M)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_to_files_and_anchors(page):
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked offline
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (resolved.suffix != ".md" or anchor not in anchors(resolved)):
            broken.append(f"{target}: no heading #{anchor}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_slug_is_githubs():
    assert slug("The paper's numbers") == "the-papers-numbers"
    assert slug("heatmaps and gallery") == "heatmaps-and-gallery"
    assert slug("`caption`") == "caption"


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.name)
def test_every_shell_block_is_marked_or_run_and_its_options_exist(block):
    if block.marker is not None:
        kind, value = block.marker
        if kind == "needs":
            unknown = set(value.split()) - set(NEEDS)
            assert value.split() and not unknown, (
                f"{block.name}: needs {value!r}; known: {', '.join(NEEDS)}")
        else:
            test_file = ROOT / value
            assert test_file.is_file(), f"{block.name}: run by {value}, which does not exist"
            source = test_file.read_text(encoding="utf-8")
            # A test that reads the block from the page names the page; another spells the
            # block's options in its own commands.
            missing = [option for argv in commands(block.text) for option in given_options(argv)
                       if f'"{option}"' not in source]
            assert block.page.name in source or not missing, (
                f"{block.name}: {value} neither reads {block.page.name} nor gives {missing}")
    for argv in commands(block.text):
        command = sub_command(argv)
        listed = options_of(command)
        assert listed, f"{block.name}: 'captioner {' '.join(command)} --help' lists no option"
        unknown = [option for option in given_options(argv)
                   if not known(as_parsed(command, option), listed)]
        assert not unknown, f"{block.name}: captioner {' '.join(command)} takes no {unknown}"


def test_the_block_parser_finds_commands_options_and_markers(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("text\n\n<!-- needs: coco -->\n\n```bash\n"
                    "pip install -e . && captioner fetch-spice && captioner demo  # a comment\n"
                    "X=1 captioner fit --config a.yaml \\\n    --trainer.devices=2\n```\n\n"
                    "```python\nprint(1)\n```\n```sh\ncaptioner bench page docs/b.md\n```\n")
    first, second = shell_blocks(page)
    assert first.marker == ("needs", "coco") and second.marker is None
    assert commands(first.text) == [["fetch-spice"], ["demo"],
                                    ["fit", "--config", "a.yaml", "--trainer.devices=2"]]
    assert given_options(commands(first.text)[2]) == ["--config", "--trainer.devices"]
    assert sub_command(commands(second.text)[0]) == ("bench", "page")
    assert known("--trainer.logger.init_args.version", frozenset({"--trainer.logger"}))
    assert not known("--trainer.loggr", frozenset({"--trainer.logger"}))


def test_an_option_a_command_does_not_take_is_found():
    argv = commands("captioner caption photos/ --ckpt a.ckpt --formt jsonl")[0]
    listed = options_of(sub_command(argv))
    assert "--format" in listed
    assert [o for o in given_options(argv) if not known(o, listed)] == ["--formt"]


UNMARKED = [block for block in BLOCKS if block.marker is None]


@pytest.mark.slow
@pytest.mark.parametrize("block", UNMARKED, ids=lambda b: b.name)
def test_an_unmarked_shell_block_runs(block, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "captioner"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m captioner.cli "$@"\n')
    shim.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", block.text], cwd=work, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"{block.name}:\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}"


# docs/benchmarks.md: generated by `captioner bench page`, whose regeneration changes only figures.

BENCHMARKS_PAGE = ROOT / "docs" / "benchmarks.md"
TINY_MODEL = ["--batch-size", "2", "--grid", "3", "--channels", "8", "--vocab-size", "20",
              "--caption-length", "4", "--beam-size", "2", "--max-length", "3", "--repeats", "1",
              "--warmup", "0", "--threads", "1", "--mappings", "softmax,sparsemax"]


def without_figures(text: str) -> str:
    return re.sub(r"[0-9]+", "N", text)


def test_the_benchmark_page_names_the_command_that_regenerates_it():
    assert "captioner bench page docs/benchmarks.md" in (ROOT / "README.md").read_text()
    assert "captioner bench page docs/benchmarks.md" in BENCHMARKS_PAGE.read_text()


def test_every_command_of_the_benchmark_page_parses(tmp_path):
    from captioner.benchmarks import page
    from captioner.commands import bench

    blocks = page.find_blocks(BENCHMARKS_PAGE.read_text(encoding="utf-8"))
    assert {block.benchmark for block in blocks} == {"attention", "model", "fit"}
    for block in blocks:
        args = bench.build_parser(block.benchmark).parse_args(
            [*block.argv, "--markdown", str(tmp_path / "table.md")])
        assert args.markdown == tmp_path / "table.md"


def test_regenerating_the_page_keeps_its_prose_and_changes_only_figures():
    from captioner.benchmarks import page

    text = BENCHMARKS_PAGE.read_text(encoding="utf-8")
    calls = []

    def fake(block, markdown: Path) -> int:
        calls.append(block.command)
        markdown.write_text(f"Machine: a CPU. Date: 2026-01-0{len(calls)}.\n\n"
                            f"| mapping | ms |\n| --- | ---: |\n| softmax | {len(calls)}.5 |\n")
        return 0

    once = page.regenerate(text, fake)
    twice = page.regenerate(once, fake)
    assert once != twice and without_figures(once) == without_figures(twice)
    # Outside the generated blocks the page is as it was.
    assert without_figures(page.regenerate(text, fake)) == without_figures(once)
    outside = re.compile(r"<!-- generated by: .*?<!-- end of generated -->", re.S)
    assert outside.sub("", once) == outside.sub("", text)
    assert calls[:len(page.find_blocks(text))] == [b.command for b in page.find_blocks(text)]


def test_a_failed_benchmark_leaves_the_page_as_it_was(tmp_path, capsys, monkeypatch):
    from captioner.commands import bench

    target = tmp_path / "page.md"
    original = ("# B\n\n<!-- generated by: captioner bench model --repeats 1 -->\nold table\n"
                "<!-- end of generated -->\n")
    target.write_text(original)
    monkeypatch.setattr(bench, "run_block", lambda block, markdown: 1)
    assert bench.main(["page", str(target)]) == 1
    assert target.read_text() == original
    assert "ended with status 1; the page is left as it was" in capsys.readouterr().err


@pytest.mark.parametrize("text, message", [
    ("no block at all\n", "holds no '<!-- generated by: captioner bench ... -->' block"),
    ("<!-- generated by: captioner bench model -->\ntable\n", "line 1: generated block not "
     "closed"),
    ("table\n<!-- end of generated -->\n", "line 2: '<!-- end of generated -->' without an "
     "opening"),
    ("<!-- generated by: rm -rf / -->\n<!-- end of generated -->\n",
     "line 1: 'rm -rf /' is not 'captioner bench {attention,model,fit} ...'"),
    ("<!-- generated by: captioner bench model --markdown x.md -->\n<!-- end of generated -->\n",
     "gives --markdown, which the page sets"),
])
def test_a_malformed_page_is_one_line_with_status_2_before_any_benchmark(text, message,
                                                                         tmp_path, capsys):
    from captioner.commands import bench

    target = tmp_path / "page.md"
    target.write_text(text)
    with pytest.raises(SystemExit) as stopped:
        bench.main(["page", str(target)])
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert message in error and len(error.strip().splitlines()) == 1, error
    assert target.read_text() == text


def test_bench_markdown_names_machine_versions_and_date_and_changes_only_figures(tmp_path):
    from captioner.commands import bench

    tables = []
    for run in range(2):
        out = tmp_path / f"model{run}.md"
        assert bench.main(["model", *TINY_MODEL, "--markdown", str(out)]) == 0
        tables.append(out.read_text())
    first_line = tables[0].splitlines()[0]
    assert first_line.startswith("Machine: ") and "no GPU used" in first_line
    assert re.search(r"torch \d", first_line) and re.search(r"Date: \d{4}-\d\d-\d\d\.$",
                                                            first_line)
    assert "| mapping | train step ms | x softmax |" in tables[0]
    assert re.search(r"^\| sparsemax \| [0-9.]+ \| [0-9.]+x \|", tables[0], re.M)
    assert without_figures(tables[0]) == without_figures(tables[1])


# The Python examples of README.md and docs/ run, with a real checkpoint and image.

def python_blocks(page: Path) -> list[tuple[int, str]]:
    """(1-based line of the opening fence, code) of each ```python block of ``page``."""
    text = page.read_text(encoding="utf-8")
    return [(text[:match.start()].count("\n") + 1, match[1])
            for match in re.finditer(r"^```python\n(.*?)^```", text, re.M | re.S)]


PYTHON_BLOCKS = [(page, line, code) for page in PAGES for line, code in python_blocks(page)]


@pytest.mark.slow
@pytest.mark.parametrize("page, line, code", PYTHON_BLOCKS,
                         ids=[f"{p.relative_to(ROOT)}:{n}" for p, n, _ in PYTHON_BLOCKS])
def test_a_python_example_runs(page, line, code, tiny_checkpoint, synthetic_data):
    image = next(synthetic_data.image_root.rglob("*.png"))
    # The examples' checkpoint and photo are the reader's; these are the tests'.
    code = re.sub(r'"[^"\s]+\.ckpt"', repr(str(tiny_checkpoint)), code)
    code = code.replace('"photo.jpg"', repr(str(image)))
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(code, f"{page.relative_to(ROOT)}:{line}", "exec"), {})


def test_every_config_the_docs_name_exists():
    missing = [f"{page.relative_to(ROOT)}: {name}"
               for page in PAGES
               for name in re.findall(r"configs/[\w./-]+\.yaml", page.read_text(encoding="utf-8"))
               if not (ROOT / name).is_file()]
    assert not missing, missing
