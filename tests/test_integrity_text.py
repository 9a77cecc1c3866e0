"""Untrusted text at the boundary: a checkpoint's vocabulary cannot reach the terminal with
control characters, and text output escapes them."""

from __future__ import annotations

import pytest
import robust_inputs as bad

from data_prep.text import printable, unsafe_character

FAST = ["--beam-size", "1", "--max-length", "4", "--no-progress", "--device", "cpu"]

# What a hostile vocabulary word could do to the terminal that shows a caption.
TERMINAL_ATTACKS = {
    "clear screen": "red\x1b[2J\x1b[H",
    "window title (OSC + BEL)": "\x1b]0;pwned\x07cross",
    "hidden text": "\x1b[8msecret",
    "backspaces": "dog\x08\x08\x08cat",
    "right-to-left override": "car\u202ereversed",
    "C1 control (CSI)": "cat\x9b2J",
}


@pytest.mark.parametrize("name", list(TERMINAL_ATTACKS))
def test_a_checkpoint_vocabulary_with_control_characters_is_refused_naming_the_file(
        name, tiny_checkpoint, tmp_path, capsys):
    word = TERMINAL_ATTACKS[name]

    def poison(checkpoint: dict) -> None:
        checkpoint["vocabulary"]["itos"][4] = word

    ckpt = bad.write_altered_checkpoint(tiny_checkpoint, tmp_path / "hostile.ckpt", poison)
    image = bad.write_png(tmp_path / "good.png")
    outcome = bad.run_cli(capsys, ["caption", image, "--ckpt", ckpt, *FAST])
    line = bad.assert_user_error(outcome, "caption", str(ckpt), "vocabulary word 4",
                                 f"U+{ord(unsafe_character(word)):04X}")
    assert unsafe_character(line) is None, line  # the word is shown escaped
    assert unsafe_character(outcome.out) is None


def test_printable_escapes_every_control_and_format_character():
    assert printable("a\x1b[2Jb\x07\x08\u202e\x9b\\") == "a\\x1b[2Jb\\x07\\x08\\u202e\\x9b\\\\"
    assert printable("café ünïcode 猫") == "café ünïcode 猫"
    assert unsafe_character("plain words") is None
    assert unsafe_character("zero\u200bwidth") == "\u200b"
