"""`captioner score` killed mid-run: its --out file is the previous one or absent, never half
written, no temporary file is left, and a rerun gives the uninterrupted run's metrics."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.java, pytest.mark.subprocess]

# 4000 images x 5 references: about 2 s of BLEU, CIDEr and ROUGE-L after the PTB tokenizer on
# the 2-core CI machine, time enough to kill the process while it scores.
N_IMAGES = 4000


@pytest.fixture(scope="module")
def captions(tmp_path_factory):
    folder = tmp_path_factory.mktemp("captions")
    rng = random.Random(0)
    words = [f"w{i}" for i in range(300)] + ["a", "the", "on", "of", "red", "dog", "cat"]

    def sentence():
        return " ".join(rng.choice(words) for _ in range(rng.randint(8, 14))) + "."

    references = {
        "images": [{"id": i} for i in range(N_IMAGES)],
        "annotations": [
            {"image_id": i, "id": 5 * i + k, "caption": sentence()}
            for i in range(N_IMAGES)
            for k in range(5)
        ],
    }
    results = [{"image_id": i, "caption": sentence()} for i in range(N_IMAGES)]
    (folder / "refs.json").write_text(json.dumps(references))
    (folder / "results.json").write_text(json.dumps(results))
    return folder


def _start(captions, out, tmpdir):
    cmd = [
        sys.executable, "-m", "captioner.cli", "score",
        "--results", str(captions / "results.json"), "--references", str(captions / "refs.json"),
        "--metrics", "Bleu,CIDEr,ROUGE_L", "--out", str(out), "--overwrite",
    ]  # fmt: skip
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _kill_while_scoring(proc, tmpdir):
    """SIGKILL ``proc`` once the PTB tokenizer's temporary folder has come and gone (Python is
    then computing the metrics); fails if the process finished first."""
    seen_tokenizer = False
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        tokenizing = any(p.name.startswith("captioner-ptb-") for p in tmpdir.iterdir())
        seen_tokenizer |= tokenizing
        if seen_tokenizer and not tokenizing:
            break
        assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
        time.sleep(0.01)
    time.sleep(0.3)
    assert proc.poll() is None, "score finished before it could be killed: use more images"
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL


def test_killed_score_leaves_no_partial_output_and_a_rerun_gives_the_same_metrics(
    captions, tmp_path
):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    reference = tmp_path / "reference" / "metrics.json"
    proc = _start(captions, reference, tmpdir)
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr.decode()[-2000:]
    expected = json.loads(reference.read_text())
    assert 0 < expected["CIDEr"] < 10 and len(expected["per_image"]) == N_IMAGES

    out_dir = tmp_path / "out"
    out_dir.mkdir()
    fresh, previous = out_dir / "fresh.json", out_dir / "previous.json"
    previous.write_text('{"CIDEr": 0.5}\n')
    for out in (fresh, previous):
        _kill_while_scoring(_start(captions, out, tmpdir), tmpdir)
        assert not fresh.exists()
        assert previous.read_text() == '{"CIDEr": 0.5}\n'
        assert sorted(p.name for p in out_dir.iterdir()) == ["previous.json"]
        assert list(tmpdir.iterdir()) == []

    proc = _start(captions, previous, tmpdir)
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr.decode()[-2000:]
    assert json.loads(previous.read_text()) == expected
    umask = os.umask(0)
    os.umask(umask)
    assert previous.stat().st_mode & 0o777 == 0o666 & ~umask
    assert sorted(p.name for p in out_dir.iterdir()) == ["previous.json"]


def test_a_write_that_fails_half_way_keeps_the_previous_file(tmp_path):
    # A file-size limit (as a full disk or a quota) stops the write of METRICS.json after
    # 16 KiB: the previous file must survive whole, with no temporary file beside it.
    n = 200
    references = {
        "images": [{"id": i} for i in range(n)],
        "annotations": [{"image_id": i, "id": i, "caption": f"a dog {i % 7}"} for i in range(n)],
    }
    (tmp_path / "refs.json").write_text(json.dumps(references))
    results = [{"image_id": i, "caption": "a dog"} for i in range(n)]
    (tmp_path / "results.json").write_text(json.dumps(results))
    out = tmp_path / "out" / "metrics.json"
    out.parent.mkdir()
    out.write_text('{"CIDEr": 0.5}\n')

    def limit_file_size():
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG)
        resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))

    cmd = [
        sys.executable, "-m", "captioner.cli", "score",
        "--results", str(tmp_path / "results.json"), "--references", str(tmp_path / "refs.json"),
        "--metrics", "Bleu,CIDEr,ROUGE_L", "--out", str(out), "--overwrite",
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=600, preexec_fn=limit_file_size,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert out.read_text() == '{"CIDEr": 0.5}\n'
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"captioner score: could not write {out}: {out.parent}: the file "
                           "size limit (ulimit -f) was reached after "), line
    assert line.endswith("of metrics.json; the previous metrics.json is kept; raise the limit "
                         "and run again"), line
    assert [p.name for p in out.parent.iterdir()] == ["metrics.json"]
