"""DecodingOptions: one place for the defaults, validated, reaching validation, inference and
the commands; <pad>, <start> and (unless allowed) <unk> are never generated."""

from __future__ import annotations

import pytest
import torch
from test_decoding import constant_decoder, random_batch, repeated_trigrams

from captioner.commands.options import options_of
from captioner.inference.pipeline import Captioner
from captioner.model.decoding_options import DecodingOptions, DecodingOverrides, apply_overrides
from data_prep.vocab import Vocabulary


class _ModuleWith:
    """A CaptioningModule's ``decode`` around a hand-made decoder (scores fixed per word)."""

    def __init__(self, decoder, decoding: DecodingOptions) -> None:
        from captioner.training.module import CaptioningModule

        self.decode = CaptioningModule.decode.__get__(self)
        self.model = type("Model", (), {"decoder": decoder})()
        self.decoding = decoding
        self.hparams = type("HParams", (), {"output_mapping": "softmax"})()


def _decode(bias: dict[int, float], **options) -> list[list[int]]:
    decoder = constant_decoder({Vocabulary.END_ID: -3.0, **bias})
    features, _ = random_batch(batch=2)
    module = _ModuleWith(decoder, DecodingOptions(beam_size=1, max_length=6, **options))
    return [hypothesis.token_ids for hypothesis in module.decode(features)]


def test_unk_pad_and_start_are_never_generated_unless_unk_is_allowed():
    # <unk> scores best, then <pad> and <start>, then word 5: only word 5 may be written.
    bias = {Vocabulary.UNK_ID: 4.0, Vocabulary.PAD_ID: 3.5, Vocabulary.START_ID: 3.0, 5: 2.0}
    for tokens in _decode(bias):
        assert tokens == [5] * 6
    for tokens in _decode(bias, allow_unk=True):
        assert tokens == [Vocabulary.UNK_ID] * 6


def test_block_trigrams_reaches_the_search():
    bias = {5: 3.0, 6: 2.0, 7: 1.0}
    assert all(repeated_trigrams(tokens) for tokens in _decode(bias))
    assert not any(repeated_trigrams(tokens) for tokens in _decode(bias, block_trigrams=True))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"beam_size": 0}, "beam_size must be an integer >= 1"),
        ({"max_length": 2.5}, "max_length must be an integer >= 1"),
        ({"length_normalization": -1}, "length_normalization must be a finite number >= 0"),
        ({"length_normalization": float("inf")}, "must be a finite number >= 0, got inf"),
        ({"block_trigrams": "yes"}, "block_trigrams must be true or false"),
        ({"beam": 3}, "unknown decoding option(s) beam"),
    ],
)
def test_bad_options_are_refused_by_name(value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        DecodingOptions.coerce(value)


def test_command_line_overrides_the_checkpoints_own_options(tiny_checkpoint):
    captioner = Captioner.load(tiny_checkpoint)
    assert captioner.decoding == DecodingOptions(beam_size=2, max_length=12)  # from training
    from captioner.commands.caption import build_parser

    parser = build_parser()
    given = ["image.png", "--ckpt", str(tiny_checkpoint)]
    def overrides(argv):
        return options_of(parser.parse_args(argv), DecodingOverrides)

    options = apply_overrides(captioner.decoding, overrides(given))
    assert options == captioner.decoding
    options = apply_overrides(captioner.decoding, overrides(
        [*given, "--beam-size", "4", "--block-trigrams", "--allow-unk"]))
    assert options == DecodingOptions(beam_size=4, max_length=12, block_trigrams=True,
                                      allow_unk=True)
    with pytest.raises(ValueError, match="beam_size"):
        apply_overrides(captioner.decoding,
                        overrides([*given, "--beam-size", "0"]))


def test_validation_and_test_decode_with_the_models_options(tiny_checkpoint):
    module = Captioner.load(tiny_checkpoint).module
    size = module.hparams.image_size
    with torch.no_grad():
        features = module.model.encoder(torch.rand(3, 3, size, size))
    module.decoding = DecodingOptions(beam_size=2, max_length=1)  # what model.decoding sets
    assert all(len(h.token_ids) <= 1 for h in module.decode(features))
    module.decoding = DecodingOptions(beam_size=2, max_length=12)
    assert any(len(h.token_ids) > 1 for h in module.decode(features))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--size", "3"], "size must be between 32 and 4096 pixels, got 3"),
        # 100,000 px drew figures of 30 GB each, until the kernel's OOM killer ended it.
        (["--size", "100000"], "size must be between 32 and 4096 pixels, got 100000"),
        (["--vmax", "0"], "vmax must be a finite number > 0, got 0.0"),
        (["--vmax", "x"], "--vmax: invalid value x"),
        (["--vmax", "nan"], "--vmax: invalid value nan"),
        (["--vmax", "inf"], "--vmax: invalid value inf"),
        (["--batch-size", "0"], "batch_size must be >= 1, got 0"),
    ],
)
def test_figure_and_batch_options_are_checked_before_any_work(argv, message, capsys):
    """Refused in one line with status 2 before any file is read (none of these exists): by
    the parser (not a number; YAML spells nan and inf .nan and .inf) or by the command."""
    from captioner.commands.heatmaps import main

    try:
        code = main(["image.png", "--ckpt", "a.ckpt", "--out", "out", *argv])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("captioner heatmaps: ") and err.count("\n") == 1 and message in err


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf"])
@pytest.mark.parametrize("command", ["score", "evaluate"])
def test_score_and_evaluate_refuse_a_spice_timeout_that_is_not_a_positive_number(
        command, value, capsys):
    import importlib

    main = importlib.import_module(f"eval.commands.{command}").main
    required = {"score": ["--results", "r.json", "--references", "refs.json"],
                "evaluate": ["--ckpt", "a.ckpt", "--data", "d.json", "--images", "images"]}
    # Refused before any file is read (none of these exists): nan and inf by the parser,
    # which reads YAML's numbers (.nan, .inf), the others by the command.
    try:
        code = main([*required[command], "--spice-timeout", value])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"captioner {command}: ") and err.count("\n") == 1
    expected = (f"spice_timeout must be a finite number > 0, got {float(value)}"
                if value in ("-1", "0") else f"--spice_timeout: invalid value {value}")
    assert expected in err
