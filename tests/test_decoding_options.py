"""DecodingOptions: one place for the defaults, validated, reaching validation, inference and
the commands; <pad>, <start> and (unless allowed) <unk> are never generated."""

from __future__ import annotations

import argparse

import pytest
import torch
from test_decoding import constant_decoder, random_batch, repeated_trigrams

from captioner.commands.options import add_decoding_arguments, decoding_options
from captioner.decoding_options import DecodingOptions
from captioner.inference import Captioner
from data_prep.vocab import Vocabulary


class _ModuleWith:
    """A CaptioningModule's ``decode`` around a hand-made decoder (scores fixed per word)."""

    def __init__(self, decoder, decoding: DecodingOptions) -> None:
        from captioner.lightning_module import CaptioningModule

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
    parser = argparse.ArgumentParser()
    add_decoding_arguments(parser)
    options = decoding_options(parser.parse_args([]), captioner.decoding)
    assert options == captioner.decoding
    options = decoding_options(
        parser.parse_args(["--beam-size", "4", "--block-trigrams", "--allow-unk"]),
        captioner.decoding,
    )
    assert options == DecodingOptions(beam_size=4, max_length=12, block_trigrams=True,
                                      allow_unk=True)
    with pytest.raises(ValueError, match="beam_size"):
        decoding_options(parser.parse_args(["--beam-size", "0"]), captioner.decoding)


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
        (["--size", "3"], "argument --size: must be >= 32, got 3"),
        # 100,000 px drew figures of 30 GB each, until the kernel's OOM killer ended it.
        (["--size", "100000"], "argument --size: must be at most 4096, got 100000"),
        (["--vmax", "0"], "argument --vmax: must be a finite number > 0, got 0"),
        (["--vmax", "x"], "argument --vmax: not a number: 'x'"),
        (["--vmax", "nan"], "argument --vmax: must be a finite number > 0, got nan"),
        (["--vmax", "inf"], "argument --vmax: must be a finite number > 0, got inf"),
        (["--batch-size", "0"], "argument --batch-size: must be >= 1, got 0"),
    ],
)
def test_figure_and_batch_options_are_checked_when_parsed(argv, message, capsys):
    from captioner.commands.options import add_figure_arguments

    parser = argparse.ArgumentParser(prog="captioner heatmaps")
    add_figure_arguments(parser, vmax_default="run maximum")
    add_decoding_arguments(parser)
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


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
