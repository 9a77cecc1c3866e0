"""Lightning training: a few steps per attention mapping, vocabulary, schedule, bad inputs."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from captioner.checkpointing import load_safely, save_atomically
from captioner.training.datamodule import CaptionDataModule
from captioner.training.module import _vocabulary_difference, corpus_scores, lr_decay_factor
from data_prep.vocab import Vocabulary


@pytest.mark.parametrize("mapping", ["softmax", "sparsemax"])
def test_a_few_training_steps_per_output_attention(mapping, synthetic_data, tiny_fit, tmp_path):
    trainer, model, _ = tiny_fit(synthetic_data, tmp_path, max_steps=2, output_attention=mapping)
    assert trainer.global_step == 2
    assert torch.isfinite(trainer.callback_metrics["train/loss"])
    for name in ("val/Bleu_4", "val/CIDEr"):
        assert 0.0 <= float(trainer.callback_metrics[name])
    assert type(model.model.decoder.output_attention.mapping).__name__.lower() == mapping


def test_tvmax_checkpoint_holds_everything_needed(tiny_checkpoint, synthetic_data):
    checkpoint = load_safely(tiny_checkpoint)  # weights_only=True
    assert checkpoint["global_step"] == 4
    assert checkpoint["hyper_parameters"]["output_attention"] == "tvmax"
    stored = Vocabulary.from_dict(checkpoint["vocabulary"])
    assert len(stored) == checkpoint["hyper_parameters"]["vocab_size"]
    assert any(key.startswith("model.encoder.") for key in checkpoint["state_dict"])


def test_the_grid_probe_leaves_a_trainable_encoders_statistics_alone():
    # fit probes the grid at its start (to check validation's beam search against memory),
    # with the module in train mode: a trainable encoder folded the zero image into its
    # batch-norm running statistics.
    from conftest import TINY_IMAGE_SIZE, tiny_model_kwargs

    from captioner.training.module import CaptioningModule

    module = CaptioningModule(vocab_size=10, **tiny_model_kwargs(encoder_trainable=True)).train()
    before = {k: v.clone() for k, v in module.model.encoder.state_dict().items()}
    assert module.grid() == (TINY_IMAGE_SIZE // 32, TINY_IMAGE_SIZE // 32)
    assert module.model.encoder.training
    for name, value in module.model.encoder.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_vocabulary_counts_training_tokens_only(synthetic_data):
    raw = json.loads(synthetic_data.karpathy_json.read_text())
    counts = Counter(
        token
        for image in raw["images"]
        if image["split"] in ("train", "restval")
        for sentence in image["sentences"]
        for token in sentence["tokens"]
    )
    data = CaptionDataModule(synthetic_data.karpathy_json, synthetic_data.image_root, min_count=3)
    words = set(data.vocabulary.itos[4:])
    assert words == {word for word, count in counts.items() if count >= 3}
    assert data.vocabulary.itos[:4] == ["<pad>", "<start>", "<end>", "<unk>"]


def test_a_vocabulary_mismatch_says_how_the_vocabularies_differ():
    specials = ["<pad>", "<start>", "<end>", "<unk>"]
    dogs, cats = Vocabulary([*specials, "a", "dog"]), Vocabulary([*specials, "a", "cat"])
    assert _vocabulary_difference(dogs, cats) == (
        "both 6 words, but word 5 is 'dog' in the checkpoint and 'cat' from the data")
    assert _vocabulary_difference(dogs, Vocabulary(specials)) == "6 vs 4 words"


def test_training_batches_hold_every_reference(synthetic_data):
    data = CaptionDataModule(
        synthetic_data.karpathy_json, synthetic_data.image_root, min_count=1, image_size=64,
        batch_size=4, eval_batch_size=3, num_workers=0,
    )
    data.setup("fit")
    raw = json.loads(synthetic_data.karpathy_json.read_text())
    train_images = [image for image in raw["images"] if image["split"] == "train"]
    assert len(data.datasets["train"]) == sum(len(image["sentences"]) for image in train_images)
    batch = next(iter(data.train_dataloader()))
    assert batch["inputs"].shape == (4, 3, 64, 64)
    captions = batch["captions"]
    assert (captions[:, 0] == Vocabulary.START_ID).all()
    lengths = (captions != Vocabulary.PAD_ID).sum(1)
    assert (captions[torch.arange(4), lengths - 1] == Vocabulary.END_ID).all()
    val = next(iter(data.val_dataloader()))
    first = next(image for image in raw["images"] if image["split"] == "val")
    assert val["references"][0] == [" ".join(s["tokens"]) for s in first["sentences"]]
    assert val["image_ids"][0] == first["cocoid"]


def test_missing_image_is_an_error_naming_it(synthetic_data, tmp_path):
    raw = json.loads(synthetic_data.karpathy_json.read_text())
    raw["images"][0]["filename"] = "no_such_image.png"
    broken = tmp_path / "dataset_broken.json"
    broken.write_text(json.dumps(raw))
    data = CaptionDataModule(broken, synthetic_data.image_root, min_count=1)
    with pytest.raises(FileNotFoundError, match="no_such_image.png"):
        data.setup("fit")


def test_learning_rate_schedule_decays_after_the_tenth_epoch():
    factors = [lr_decay_factor(epoch, decay=0.99, decay_after=10) for epoch in range(13)]
    assert factors[:10] == [1.0] * 10
    assert factors[10:] == pytest.approx([0.99, 0.99**2, 0.99**3])


def test_corpus_scores_on_hand_checked_cases():
    references = {
        1: ["a small red circle on the left", "a red circle"],
        2: ["a big blue star in the middle", "one blue star"],
        3: ["a green square at the top", "green square"],
    }
    exact = {1: "a small red circle on the left", 2: "a big blue star in the middle",
             3: "a green square at the top"}
    perfect = corpus_scores(exact, references)
    # Every hypothesis equals a reference of the same length: BLEU-4 is 1 (up to
    # pycocoevalcap's 1e-9 smoothing); CIDEr-D is positive.
    assert perfect["Bleu_4"] == pytest.approx(1.0, abs=1e-6)
    assert perfect["CIDEr"] > 1.0
    wrong = corpus_scores({1: "zebra", 2: "zebra", 3: "zebra"}, references)
    assert wrong["CIDEr"] == 0.0 and wrong["Bleu_4"] < 1e-6


def test_ctrl_c_while_saving_is_delivered_once_the_checkpoint_is_whole(
        tmp_path, ctrl_c_inside_torch_save):
    import signal

    ctrl_c_inside_torch_save(1)
    path = tmp_path / "model.ckpt"
    with pytest.raises(KeyboardInterrupt):
        save_atomically({"weights": torch.ones(2)}, path)
    assert torch.equal(load_safely(path)["weights"], torch.ones(2))
    assert [p.name for p in tmp_path.iterdir()] == ["model.ckpt"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_atomic_save_keeps_the_old_file_when_writing_fails(tmp_path):
    path = tmp_path / "model.ckpt"
    save_atomically({"weights": torch.ones(2)}, path)
    with pytest.raises(Exception):  # noqa: B017 - any pickling error
        save_atomically({"weights": torch.zeros(2), "bad": lambda: None}, path)
    assert torch.equal(load_safely(path)["weights"], torch.ones(2))
    assert [p.name for p in tmp_path.iterdir()] == ["model.ckpt"]
