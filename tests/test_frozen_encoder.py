"""Checkpoints of a frozen encoder refer to its weights file (path and SHA-256) instead of
holding a copy; they load where that file is, refuse in one line where it is missing or
changed, and ``captioner export`` makes a self-contained copy that loads anywhere alike."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

ENCODER_KEY = "frozen_encoder"


@pytest.fixture(scope="module")
def frozen(synthetic_data, tiny_fit, tmp_path_factory):
    """(checkpoint, encoder weights file, an image): a tiny captioner trained with a frozen
    ResNet-18 read from a local weights file."""
    import torchvision

    out = tmp_path_factory.mktemp("frozen")
    torch.manual_seed(0)
    weights = out / "encoder.pt"
    torch.save(torchvision.models.resnet18().state_dict(), weights)
    trainer, _, _ = tiny_fit(synthetic_data, out, max_steps=2, encoder_weights=str(weights))
    checkpoint = out / "frozen.ckpt"
    trainer.save_checkpoint(checkpoint, weights_only=False)
    image = sorted((synthetic_data.image_root / "test").iterdir())[0]
    return checkpoint, weights, image


def _caption(path: Path, image: Path) -> tuple[str, torch.Tensor]:
    from captioner.inference.pipeline import Captioner

    [caption] = Captioner.load(path).caption([image])
    return caption.text, caption.attention


def test_the_checkpoint_names_the_encoder_weights_instead_of_holding_them(frozen, tmp_path):
    from captioner.model.frozen_encoder import export_self_contained
    from data_prep.hashes import file_sha256

    checkpoint, weights, _ = frozen
    stored = torch.load(checkpoint, weights_only=True)
    assert not [key for key in stored["state_dict"] if key.startswith("model.encoder.")]
    assert any(key.startswith("model.decoder.") for key in stored["state_dict"])
    assert stored[ENCODER_KEY] == {"weights": str(weights.resolve()),
                                   "sha256": file_sha256(weights)}
    whole = tmp_path / "whole.ckpt"
    assert export_self_contained(checkpoint, whole) is True
    exported = torch.load(whole, weights_only=True)
    assert ENCODER_KEY not in exported
    encoder_state = torch.load(weights, weights_only=True)
    for key, value in encoder_state.items():
        if not key.startswith(("fc.", "layer4.")):  # the tiny model keeps up to layer4
            name = f"model.encoder.trunk.{_trunk_index(key)}"
            assert torch.equal(exported["state_dict"][name], value), name
    # The encoder is most of a self-contained file (ResNet-18: 45 of about 47 MB here).
    assert checkpoint.stat().st_size * 5 < whole.stat().st_size


def _trunk_index(key: str) -> str:
    """The GridEncoder trunk's name of a torchvision ResNet state_dict key."""
    order = {"conv1": 0, "bn1": 1, "layer1": 4, "layer2": 5, "layer3": 6, "layer4": 7}
    head, rest = key.split(".", 1)
    return f"{order[head]}.{rest}"


def test_it_captions_alike_with_the_file_and_as_the_exported_copy(frozen, tmp_path):
    from captioner.model.frozen_encoder import export_self_contained

    checkpoint, weights, image = frozen
    text, attention = _caption(checkpoint, image)
    whole = tmp_path / "whole.ckpt"
    export_self_contained(checkpoint, whole)
    moved = weights.with_name("elsewhere.pt")
    weights.rename(moved)
    try:
        text_whole, attention_whole = _caption(whole, image)  # no weights file needed
    finally:
        moved.rename(weights)
    assert text_whole == text
    assert torch.equal(attention_whole, attention)


def test_a_missing_or_changed_encoder_file_is_one_line(frozen, capsys):
    from captioner.cli import main

    checkpoint, weights, image = frozen
    moved = weights.with_name("moved.pt")
    weights.rename(moved)
    try:
        assert main(["caption", str(image), "--ckpt", str(checkpoint), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert (f"{checkpoint}: its frozen encoder is not inside it but in {weights.resolve()}, "
                "which does not exist") in err
        assert "captioner export" in err
        # Other weights under the recorded name: refused by their SHA-256.
        state = torch.load(moved, weights_only=True)
        state["conv1.weight"] = state["conv1.weight"] + 1e-3
        torch.save(state, weights)
        assert main(["caption", str(image), "--ckpt", str(checkpoint), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert f"{checkpoint}: its frozen encoder is {weights.resolve()} with SHA-256" in err
        assert "the file changed since training" in err
    finally:
        moved.replace(weights)


def test_lightning_restores_it_from_the_configs_encoder(frozen, synthetic_data, tiny_fit,
                                                        tmp_path):
    """validate/test/fit --ckpt_path build the model from the config, whose encoder weights the
    checkpoint's are checked against before its decoder is loaded."""
    import lightning as L
    from conftest import TINY_IMAGE_SIZE, tiny_model_kwargs

    from captioner.training.datamodule import CaptionDataModule
    from captioner.training.module import CaptioningModule

    checkpoint, weights, _ = frozen
    data = CaptionDataModule(karpathy_json=synthetic_data.karpathy_json,
                             image_root=synthetic_data.image_root, min_count=1,
                             image_size=TINY_IMAGE_SIZE, batch_size=8, eval_batch_size=4,
                             num_workers=0)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=1)

    def model(encoder_weights):
        return CaptioningModule(vocab_size=data.vocab_size,
                                **tiny_model_kwargs(encoder_weights=encoder_weights))

    [scores] = trainer.validate(model(str(weights)), datamodule=data, ckpt_path=checkpoint,
                                verbose=False)
    assert "val/CIDEr" in scores
    other = tmp_path / "other.pt"
    state = torch.load(weights, weights_only=True)
    state["bn1.bias"] = state["bn1.bias"] + 1.0
    torch.save(state, other)
    with pytest.raises(ValueError, match="its frozen encoder is .* with SHA-256"):
        trainer.validate(model(str(other)), datamodule=data, ckpt_path=checkpoint)


@pytest.mark.parametrize("entry", [{"weights": 3, "sha256": "0" * 64},
                                   {"weights": "/x.pt", "sha256": "abc"}, "x"])
def test_a_malformed_encoder_entry_is_refused(frozen, tmp_path, entry):
    from captioner.checkpointing import CheckpointError
    from captioner.inference.pipeline import Captioner

    checkpoint, _, _ = frozen
    stored = torch.load(checkpoint, weights_only=True)
    stored[ENCODER_KEY] = entry
    bad = tmp_path / "bad.ckpt"
    torch.save(stored, bad)
    with pytest.raises(CheckpointError, match=f"{bad}: entry 'frozen_encoder' does not name"):
        Captioner.load(bad)


def test_export_command(frozen, tmp_path, capsys):
    from captioner.commands import export

    checkpoint, _, _ = frozen
    out = tmp_path / "shared.ckpt"
    assert export.main([str(checkpoint), "--out", str(out)]) == 0
    assert capsys.readouterr().out == f"wrote {out} with its frozen encoder put in\n"
    assert export.main([str(checkpoint), "--out", str(out)]) == 2  # no silent replacement
    assert f"{out}: exists; choose another --out, or pass --overwrite" in capsys.readouterr().err
    assert export.main([str(out), "--out", str(tmp_path / "again.ckpt")]) == 0
    assert "held its encoder already" in capsys.readouterr().out
