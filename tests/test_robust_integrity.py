"""Robustness table of the integrity list (items 1-16): each case that a command shows with a
prepared input runs through the CLI (in this process: the process boundary is not what these
test) and gives its exit status and the one line the user sees (``robust_inputs``'s
``INTEGRITY_CASES``). The cases that need a fault while the command runs are tested where
``INTEGRITY_COVERED_ELSEWHERE`` says; a check here keeps that list pointing at tests that
exist. ``prepare-synthetic`` on a full disk runs here, in a child process under ``ulimit -f``.
"""

from __future__ import annotations

import ast
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import lightning.pytorch  # noqa: F401  (see below)
import pytest
import robust_inputs as bad

# Lightning's log handler keeps the sys.stderr of the moment it is imported: imported here, at
# collection, rather than inside a case's captured output, whose stream is closed after it.

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", [pytest.param(name, marks=case.marks) for name, case
                                  in bad.INTEGRITY_CASES.items()])
def test_an_integrity_case_is_its_exit_status_and_one_line(name, tmp_path, capsys, request):
    case = bad.INTEGRITY_CASES[name]
    prepared = case.prepare(bad.Given(tmp_path, request.getfixturevalue))
    command = str(prepared.argv[0])
    outcome = bad.run_cli(capsys, prepared.argv, seconds=120)
    assert outcome.code == case.code, (outcome.code, outcome.err[-3000:])
    assert "Traceback" not in outcome.err, outcome.err[-3000:]
    errors = outcome.error_lines(f"captioner {command}: ")
    if case.code:
        assert len(errors) == 1, outcome.err[-3000:]
        line = errors[0]
    else:
        assert not errors, outcome.err[-3000:]
        shown = [line for line in outcome.out.splitlines()
                 if prepared.phrases and prepared.phrases[0] in line]
        assert len(shown) == (1 if prepared.phrases else 0), outcome.out[-3000:]
        line = shown[0] if shown else ""
    for phrase in prepared.phrases:
        assert phrase in line, (phrase, line)
    if prepared.check:
        prepared.check(outcome)


def _defined_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name for node in tree.body
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def test_every_item_is_a_row_or_names_the_tests_that_cover_it():
    rows = {case.item for case in bad.INTEGRITY_CASES.values()}
    elsewhere = bad.INTEGRITY_COVERED_ELSEWHERE
    assert rows | set(elsewhere) == set(range(1, 17)), sorted(rows | set(elsewhere))
    for item, tests in elsewhere.items():
        for what, node in tests:
            file, test = node.split("::")
            assert test in _defined_tests(REPO / file), f"item {item} ({what}): no {node}"


def _limited_to(size: int):
    def limit() -> None:
        _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))

    return limit


@pytest.mark.subprocess
def test_prepare_synthetic_on_a_full_disk_is_one_line_and_leaves_no_image(tmp_path):
    # ulimit -f in the child alone: a write past the limit fails as on a full disk (EFBIG;
    # Python ignores SIGXFSZ), whichever file it is, an image or a JSON file.
    out = tmp_path / "synthetic"
    done = subprocess.run(
        [sys.executable, "-m", "captioner.cli", "prepare-synthetic", "--out", str(out),
         "--train", "6", "--val", "1", "--test", "1", "--image-size", "256", "--no-progress"],
        preexec_fn=_limited_to(16_000), capture_output=True, text=True, timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"}, check=False)
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stderr == (
        f"captioner prepare-synthetic: {out}: the file size limit (ulimit -f) was reached; "
        "dataset_synthetic.json was not written; raise the limit and run again\n")
    assert sorted(p.name for p in out.rglob("*")) == []  # no image, no staging folder


def test_a_synthetic_dataset_stopped_by_the_disk_leaves_none_of_its_images(tmp_path,
                                                                           monkeypatch):
    # In-process, the same stop at the second image, after an earlier run's dataset: the
    # earlier images stay as they were, no new one appears, and the rerun completes.
    import errno

    from PIL import Image

    from data_prep.synthetic import generate

    generate(tmp_path, n_train=2, n_val=0, n_test=0, image_size=64, progress=False)
    earlier = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*.png")}
    saved = Image.Image.save
    calls = []

    def full_disk_at_the_second_image(self, path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return saved(self, path, *args, **kwargs)

    monkeypatch.setattr(Image.Image, "save", full_disk_at_the_second_image)
    with pytest.raises(OSError, match="no space left on device; dataset_synthetic.json was "
                                      "not written; free space there and run again"):
        generate(tmp_path, n_train=4, n_val=0, n_test=0, image_size=64, progress=False)
    assert {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*.png")} == earlier
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    monkeypatch.undo()
    dataset = generate(tmp_path, n_train=4, n_val=0, n_test=0, image_size=64, progress=False)
    names = [image["filename"] for image in
             json.loads(dataset.karpathy_json.read_text())["images"]]
    assert sorted(p.name for p in (tmp_path / "images" / "train").iterdir()) == names
