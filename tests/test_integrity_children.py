"""Child processes die with their parent, a child that dies mid-score is named in one line,
and the temporaries of a killed run are removed by the next run of the same writer."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
import robust_inputs as bad

from data_prep.atomic import atomic_write

java = pytest.mark.java


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@java
def test_a_jvm_dies_with_the_process_that_started_it(tmp_path):
    # The process boundary is what is tested: a parent killed with SIGKILL (as the OOM killer
    # does) runs no clean-up of its own; only the kernel can end its JVM.
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from eval.metrics.java_tools import start_java
        from eval.metrics.ptb import TOKENIZER_JAR
        jvm = start_java(["-cp", str(TOKENIZER_JAR), "edu.stanford.nlp.process.PTBTokenizer"],
                         cwd=Path({str(tmp_path)!r}))
        print(jvm.pid, flush=True)
        time.sleep(600)
        """)], stdout=subprocess.PIPE, text=True)
    jvm = int(parent.stdout.readline())
    assert _alive(jvm)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 20
    while _alive(jvm) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = _alive(jvm)
    if alive:
        os.kill(jvm, 9)
    assert not alive, "the JVM ran on after its parent was killed"


@java
def test_score_names_meteor_in_one_line_when_its_jvm_dies_mid_score(tmp_path, capsys,
                                                                    monkeypatch):
    import eval.metrics.java_tools as java_tools

    started = java_tools.start_java

    def killed_at_once(*args, **kwargs):
        process = started(*args, **kwargs)
        process.kill()  # from outside, as the OOM killer does, before it answers
        process.wait()
        return process

    monkeypatch.setattr(java_tools, "start_java", killed_at_once)
    records = [bad.karpathy_record(f"{i}.png", i, "test") for i in (5, 6)]
    references = bad.write_karpathy(tmp_path / "dataset_refs.json", records)
    results = tmp_path / "results.json"
    results.write_text(json.dumps([{"image_id": 5, "caption": "a small picture"},
                                   {"image_id": 6, "caption": "a picture"}]))
    outcome = bad.run_cli(capsys, ["score", "--results", results, "--references", references,
                                   "--split", "test", "--metrics", "Bleu,METEOR"], seconds=120)
    assert outcome.code == 1, outcome.err[-2000:]
    assert "Traceback" not in outcome.err and "BrokenPipe" not in outcome.err
    [line] = outcome.error_lines("captioner score: ")
    assert line == ("captioner score: METEOR: its Java process ended while scoring (killed by "
                    "SIGKILL); no METEOR score was made"), line


def test_the_next_write_removes_the_temporaries_of_a_killed_writer(tmp_path):
    out = tmp_path / "captions.txt"
    stale = tmp_path / ".captions.txt.k1ll3d_x.tmp"  # named as atomic_write names them
    stale.write_text("half the captions of a run killed with SIGKILL")
    held = tmp_path / ".captions.txt.runn1ng_.tmp"  # another writer's, at work: kept
    held.write_text("a writer at work")
    other = tmp_path / ".other.txt.k1ll3d_x.tmp"  # another file's: not this writer's
    other.write_text("another output's")
    with open(held, "rb") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        with atomic_write(out) as writing:
            writing.write("new\n")
        assert sorted(path.name for path in tmp_path.iterdir()) == sorted([
            other.name, held.name, out.name])


def test_a_java_work_folder_of_a_killed_run_is_removed_by_the_next(tmp_path, monkeypatch):
    from eval.metrics.java_tools import java_work_folder

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead = tmp_path / f"captioner-spice-{gone.stdout.strip()}-abcd1234"
    dead.mkdir()
    (dead / "input.json").write_text("[]")
    ours = tmp_path / f"captioner-spice-{os.getppid()}-live0000"  # a running process's
    ours.mkdir()
    with java_work_folder("spice") as work:
        assert work.parent == tmp_path and work.is_dir()
        assert not dead.exists() and ours.is_dir()
    assert not work.exists()


def test_an_output_name_near_the_limit_is_written(tmp_path, tiny_checkpoint, capsys):
    out = tmp_path / ("c" * 250 + ".txt")  # 254 bytes: its temporary's name would be 268
    image = bad.write_png(tmp_path / "good.png")
    outcome = bad.run_cli(capsys, ["caption", image, "--ckpt", tiny_checkpoint, "--out", out,
                                   "--beam-size", "1", "--max-length", "4", "--no-progress",
                                   "--device", "cpu"])
    assert outcome.code == 0, outcome.err[-2000:]
    assert out.read_text(encoding="utf-8").startswith(str(image))
    assert not bad.leftover_temporaries(tmp_path)
