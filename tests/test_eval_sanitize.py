"""Captions with line breaks must not shift captions between images (PTB tokenizer) nor hang
METEOR; the Java tools run in directories of our own."""

import json
import subprocess
import sys
import textwrap

import pytest

from eval.metrics.java_tools import JavaToolError, run_java
from eval.metrics.ptb import ptb_tokenize
from eval.metrics.sanitize import sanitize_caption

SEPARATORS = [
    "\n",
    "\r",
    "\r\n",
    "\x0b",
    "\x0c",
    "\x1c",
    "\x1d",
    "\x1e",
    "\x85",
    "\u2028",
    "\u2029",
]


@pytest.mark.parametrize("separator", [*SEPARATORS, "\t", "\x00"])
def test_sanitize_replaces_breaks_with_one_space(separator):
    assert sanitize_caption(f"  a dog{separator}runs {separator} fast ") == "a dog runs fast"


def test_sanitize_keeps_ordinary_text_and_rejects_non_strings():
    assert sanitize_caption("A café, naïve: 3 dogs!") == "A café, naïve: 3 dogs!"
    with pytest.raises(TypeError, match="must be a str"):
        sanitize_caption(None)


@pytest.mark.java
def test_line_breaks_do_not_shift_later_captions_in_the_tokenizer():
    captions = {}
    for k, separator in enumerate(SEPARATORS):
        captions[2 * k] = [f"A dog{separator}runs.", "Second one."]
        captions[2 * k + 1] = [f"neighbour {k}"]
    tokenized = ptb_tokenize(captions)
    for k in range(len(SEPARATORS)):
        assert tokenized[2 * k] == ["a dog runs", "second one"], repr(SEPARATORS[k])
        assert tokenized[2 * k + 1] == [f"neighbour {k}"]


@pytest.mark.java
def test_tokenizer_matches_pycocoevalcap_on_clean_captions():
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    captions = {
        7: ["A man's hat -- (red) isn't \"big\"...", "Two DOGS; one cat!"],
        3: ["", "x-ray of a hand, 3.5 inches"],
        9: ["a   b\tc"],
    }
    expected = PTBTokenizer().tokenize(
        {k: [{"caption": c} for c in v] for k, v in captions.items()}
    )
    assert ptb_tokenize(captions) == expected


_SCORE_SCRIPT = textwrap.dedent(
    """
    import json
    from eval.metrics.coco import score_captions
    refs = {1: ["a dog runs on the grass", "a brown dog running"],
            2: ["a cat sleeps on a sofa", "a cat lying on a couch"],
            3: ["two people ride bikes", "cyclists on a road"]}
    # image 10 + k carries the clean twin of image k (same references)
    refs.update({10 + k: v for k, v in refs.items() if k < 3})
    hyps = {1: "a dog\\nruns\\u2028on grass", 2: "a cat\\r\\non a\\x0csofa",
            3: "two people on bikes", 11: "a dog runs on grass", 12: "a cat on a sofa"}
    scores = score_captions(hyps, refs, ("Bleu", "METEOR", "ROUGE_L", "CIDEr"))
    print(json.dumps(scores.per_image))
    """
)


@pytest.mark.java
def test_newlines_in_hypotheses_score_like_clean_captions_and_meteor_exits():
    # A subprocess with a timeout: a desynchronised METEOR would hang it (at scoring or exit).
    proc = subprocess.run(
        [sys.executable, "-c", _SCORE_SCRIPT], capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr
    scores = json.loads(proc.stdout.strip().splitlines()[-1])
    # CIDEr's document frequencies count both twins' references alike, so all metrics match
    assert scores["1"] == scores["11"]
    assert scores["2"] == scores["12"]
    # the neighbour after the broken captions was scored on its own caption, not a shifted one
    assert scores["3"]["METEOR"] > 0.1
    assert scores["3"]["Bleu_1"] == pytest.approx(1.0)


@pytest.mark.java
def test_java_failures_and_timeouts_surface_stderr():
    with pytest.raises(JavaToolError, match="(?s)failed with exit status.*NoSuchMainClass"):
        run_java(["-cp", "/nonexistent", "NoSuchMainClass"], tool="probe", cwd="/", timeout=60)
    # stopped before the JVM wrote anything: said so, not an empty "last lines" heading
    with pytest.raises(JavaToolError,
                       match=r"(?s)did not finish within.*\nJava wrote nothing to stderr$"):
        run_java(["-version"], tool="probe", cwd="/", timeout=0.001)
