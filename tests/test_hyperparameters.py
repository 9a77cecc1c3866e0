"""The hyperparameters that inference reads from a checkpoint without Lightning are the
LightningModule's own: the same names, order and defaults, stored under the same key, and the
model built from them in plain torch takes the checkpoint's weights and captions alike."""

from __future__ import annotations

import inspect

import pytest
import torch

from captioner.checkpointing import HYPERPARAMETERS_KEY
from captioner.inference.checkpoint_model import CheckpointModel
from captioner.model.decoding_options import DecodingOptions
from captioner.model.hyperparameters import Hyperparameters, hparams_from_checkpoint
from data_prep.vocab import Vocabulary


def test_the_hyperparameters_are_the_lightning_modules_constructor_arguments():
    from captioner.training.module import CaptioningModule

    module = [(p.name, p.default) for p in
              inspect.signature(CaptioningModule.__init__).parameters.values()][1:]
    plain = [(p.name, p.default) for p in inspect.signature(Hyperparameters).parameters.values()]
    assert module == plain
    assert HYPERPARAMETERS_KEY == CaptioningModule.CHECKPOINT_HYPER_PARAMS_KEY


def test_the_plain_model_has_the_lightning_modules_weights_and_captions():
    from captioner.training.module import CaptioningModule

    vocabulary = Vocabulary(["<pad>", "<start>", "<end>", "<unk>", "a", "b"])
    settings = dict(vocab_size=len(vocabulary), encoder_arch="resnet18", encoder_weights=None,
                    image_size=64, feature_dim=16, embed_dim=8, hidden_dim=16,
                    attention_dim=16, output_attention="sparsemax",
                    decoding={"beam_size": 2, "max_length": 5})
    torch.manual_seed(0)
    module = CaptioningModule(**settings).eval()
    module.vocabulary = vocabulary
    stored = hparams_from_checkpoint(dict(module.hparams), "x.ckpt")
    plain = CheckpointModel(stored, vocabulary).eval()
    assert list(plain.state_dict()) == list(module.state_dict())
    plain.load_state_dict(module.state_dict(), strict=True)
    assert plain.decoding == module.decoding == DecodingOptions(beam_size=2, max_length=5)
    assert plain.grid() == module.grid() == (2, 2)
    with torch.no_grad():
        features = module.model.encoder(torch.rand(2, 3, 64, 64))
    for ours, theirs in zip(plain.decode(features), module.decode(features), strict=True):
        assert ours.token_ids == theirs.token_ids
        assert torch.equal(ours.output_attention, theirs.output_attention)
        assert plain.words(ours.token_ids) == module.words(theirs.token_ids)


@pytest.mark.parametrize(("change", "message"), [
    ({"image_size": 0}, "model.image_size must be an integer in"),
    ({"output_mapping": "argmax"}, "argmax"),
])
def test_the_plain_model_refuses_what_the_lightning_module_refuses(change, message):
    from captioner.training.module import CaptioningModule

    settings = dict(vocab_size=6, encoder_arch="resnet18", encoder_weights=None, **change)
    with pytest.raises(ValueError, match=message) as theirs:
        CaptioningModule(**settings)
    with pytest.raises(ValueError, match=message) as ours:
        CheckpointModel(settings, Vocabulary(["<pad>", "<start>", "<end>", "<unk>", "a", "b"]))
    assert str(ours.value) == str(theirs.value)
