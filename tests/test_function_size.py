"""Functions with one job: no function of the package is over :data:`MOST_LINES` lines (from its
first decorator or ``def`` to its last line, docstring included), but the numba and Triton
kernels of the attention mappings (``captioner/attention/_*.py``), whose loops are written
out for the compilers, and the few exceptions of :data:`ALLOWED`, each with why it stays."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("captioner", "data_prep", "eval")
MOST_LINES = 80
# A command module parses its arguments and calls the library: its main stays this short.
MOST_MAIN_LINES = 30

# "path:qualified name" -> why it is longer. Shorten one, and remove it here.
ALLOWED = {
    "captioner/model/decoding.py:beam_search":
        "the batched search loop advances a dozen tensors of all images x beams in step; its "
        "parts would pass them all back and forth",
    "eval/evaluation.py:evaluate_captioner":
        "captions, scores and measures the attention in one pass over the split; not yet split "
        "into those steps",
    "eval/rating/kit.py:build_kit":
        "samples, captions and draws the kit's items in one pass; not yet split into steps",
}


def _is_kernel(path: Path) -> bool:
    return path.parent.name == "attention" and path.name.startswith("_")


def function_lengths(packages=PACKAGES, root: Path = REPO) -> dict[str, int]:
    """``"path:Class.method"`` or ``"path:function"`` (nested functions too, by their outer
    names) -> its length in lines, for every function of ``packages`` outside the kernels."""
    lengths: dict[str, int] = {}

    def visit(node: ast.AST, where: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                start = min([child.lineno] + [d.lineno for d in child.decorator_list])
                lengths[f"{where}:{prefix}{child.name}"] = child.end_lineno - start + 1
                visit(child, where, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, where, f"{prefix}{child.name}.")

    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if not _is_kernel(path):
                where = path.relative_to(root).as_posix()
                visit(ast.parse(path.read_text(encoding="utf-8")), where, "")
    return lengths


def test_no_function_outside_the_kernels_is_over_the_limit():
    lengths = function_lengths()
    too_long = {name: lines for name, lines in lengths.items()
                if lines > MOST_LINES and name not in ALLOWED}
    assert not too_long, (f"functions over {MOST_LINES} lines (split them into steps with one "
                          f"job each): {too_long}")


def test_every_allowed_exception_still_exists_and_is_still_long():
    lengths = function_lengths()
    stale = {name: lengths.get(name) for name in ALLOWED
             if lengths.get(name, 0) <= MOST_LINES}
    assert not stale, f"remove these from ALLOWED (gone, or now short enough): {stale}"


def test_every_command_main_only_parses_and_calls():
    mains = {name: lines for name, lines in function_lengths().items()
             if "/commands/" in name and name.endswith(":main")}
    assert len(mains) >= 15, sorted(mains)  # every command module is measured
    too_long = {name: lines for name, lines in mains.items() if lines > MOST_MAIN_LINES}
    assert not too_long, (f"command mains over {MOST_MAIN_LINES} lines (move the policy into "
                          f"the library): {too_long}")


@pytest.mark.parametrize(("source", "expected"), [
    ("def f():\n" + "    x = 1\n" * 80, 81),
    ("class A:\n    @staticmethod\n    def g():\n        pass\n", 3),
])
def test_a_function_is_measured_from_its_first_decorator_to_its_last_line(
        tmp_path, source, expected):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(source)
    assert max(function_lengths(("pkg",), tmp_path).values()) == expected


def test_the_kernels_are_left_out(tmp_path):
    kernels = tmp_path / "pkg" / "attention"
    kernels.mkdir(parents=True)
    (kernels / "_kernel.py").write_text("def k():\n    pass\n")
    (kernels / "public.py").write_text("def p():\n    pass\n")
    assert function_lengths(("pkg",), tmp_path) == {"pkg/attention/public.py:p": 2}
