"""PTB tokenization exactly as coco-caption does it, without writing into the install.

pycocoevalcap's ``PTBTokenizer`` writes its temporary file beside its jar and runs Java
there, which fails on a read-only install and races between parallel runs. This runs the
same jar (``stanford-corenlp-3.4.1.jar`` shipped in pycocoevalcap), the same command
(``edu.stanford.nlp.process.PTBTokenizer -preserveLines -lowerCase``) and the same
punctuation filter (pycocoevalcap's ``PUNCTUATIONS``) in a temporary directory of our own,
sanitizes captions first (see :mod:`eval.metrics.sanitize`) and checks that Java returned one line
per caption instead of silently pairing lines with the wrong images.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path

from pycocoevalcap.tokenizer import ptbtokenizer

from eval.metrics.java_tools import JavaToolError, java_work_folder, run_java
from eval.metrics.sanitize import sanitize_caption

TOKENIZER_JAR = Path(ptbtokenizer.__file__).with_name(ptbtokenizer.STANFORD_CORENLP_3_4_1_JAR)
_PUNCTUATION = frozenset(ptbtokenizer.PUNCTUATIONS)


def ptb_tokenize(
    captions: Mapping[Hashable, Sequence[str]], *, timeout: float | None = 3600
) -> dict[Hashable, list[str]]:
    """Tokenize ``{key: [caption, ...]}`` like pycocoevalcap's PTBTokenizer.

    Returns ``{key: [tokenized caption, ...]}`` with the same keys and list lengths: lower-cased
    PTB tokens joined by single spaces, punctuation tokens removed. One JVM for all captions."""
    keys = [key for key, caps in captions.items() for _ in caps]
    lines = [sanitize_caption(c) for caps in captions.values() for c in caps]
    tokenized: dict[Hashable, list[str]] = {key: [] for key in captions}
    if not lines:
        return tokenized
    with java_work_folder("ptb") as tmp:
        source = tmp / "captions.txt"
        source.write_text("\n".join(lines), encoding="utf-8")
        proc = run_java(
            [
                "-cp",
                str(TOKENIZER_JAR),
                "edu.stanford.nlp.process.PTBTokenizer",
                "-preserveLines",
                "-lowerCase",
                source.name,
            ],
            tool="PTB tokenizer",
            cwd=tmp,
            timeout=timeout,
        )
    out_lines = proc.stdout.split("\n")
    # The last caption's line carries no newline; anything beyond the captions must be empty.
    if len(out_lines) < len(lines) or any(extra.strip() for extra in out_lines[len(lines) :]):
        raise JavaToolError(
            f"the PTB tokenizer returned {len(out_lines)} lines for {len(lines)} captions; "
            "refusing to pair tokenized captions with the wrong images"
        )
    for key, line in zip(keys, out_lines, strict=False):
        words = [w for w in line.rstrip().split(" ") if w not in _PUNCTUATION]
        tokenized[key].append(" ".join(words))
    return tokenized
