"""Captioner inference API: checkpoint round trip, attention shapes, incompatible checkpoints."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from PIL import Image

from captioner.checkpointing import load_safely, save_atomically
from captioner.inference.pipeline import Caption, Captioner, IncompatibleCheckpointError
from captioner.model.decoding_options import DecodingOptions
from data_prep.images import ImageLoadError


def _test_images(dataset) -> list[Path]:
    return sorted((dataset.image_root / "test").glob("*.png"))


def test_checkpoint_round_trip_gives_identical_captions(synthetic_data, tiny_fit, tmp_path):
    trainer, model, data = tiny_fit(synthetic_data, tmp_path, max_steps=2,
                                    output_attention="sparsemax")
    path = tmp_path / "roundtrip.ckpt"
    trainer.save_checkpoint(path, weights_only=False)
    images = _test_images(synthetic_data)
    options = DecodingOptions(beam_size=2, max_length=8)
    before = Captioner(model, data.vocabulary).caption(images, options)
    after = Captioner.load(path).caption(images, options)
    assert [c.text for c in after] == [c.text for c in before]
    for old, new in zip(before, after, strict=True):
        assert torch.equal(old.attention, new.attention)
        assert old.log_prob == new.log_prob


def test_captions_carry_one_attention_map_per_word(tiny_checkpoint, synthetic_data):
    captioner = Captioner.load(tiny_checkpoint)
    assert captioner.output_attention_name == "tvmax"
    assert captioner.grid == (4, 4)
    paths = _test_images(synthetic_data)[:2]
    in_memory = Image.open(paths[0]).convert("L")  # grayscale PIL images are accepted too
    captions = captioner.caption(
        [*paths, in_memory], DecodingOptions(beam_size=2, max_length=6), batch_size=2
    )
    assert len(captions) == 3
    for caption in captions:
        assert isinstance(caption, Caption)
        assert caption.text == " ".join(caption.tokens)
        assert caption.attention.shape == (len(caption.tokens), 4, 4)
        assert caption.attention.dtype == torch.float32
        assert caption.input_attention.shape == caption.attention.shape
        sums = caption.attention.sum(dim=(1, 2))
        assert torch.allclose(sums, torch.ones_like(sums), atol=1e-5)
        assert "<end>" not in caption.tokens
    assert captions[0].source == str(paths[0]) and captions[2].source == "<image 2>"


def test_unreadable_image_names_the_file(tiny_checkpoint, tmp_path):
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not an image")
    with pytest.raises(ImageLoadError, match="broken.jpg"):
        Captioner.load(tiny_checkpoint).caption([broken])


def test_incompatible_checkpoints_are_refused_clearly(tiny_checkpoint, tmp_path):
    checkpoint = load_safely(tiny_checkpoint)

    unknown_mapping = dict(checkpoint, hyper_parameters={
        **checkpoint["hyper_parameters"], "output_attention": "nosuchmax"})
    save_atomically(unknown_mapping, tmp_path / "unknown.ckpt")
    with pytest.raises(IncompatibleCheckpointError, match="nosuchmax"):
        Captioner.load(tmp_path / "unknown.ckpt")

    other_dims = dict(checkpoint, hyper_parameters={
        **checkpoint["hyper_parameters"], "hidden_dim": 64})
    save_atomically(other_dims, tmp_path / "dims.ckpt")
    with pytest.raises(IncompatibleCheckpointError, match="weights do not fit") as refused:
        Captioner.load(tmp_path / "dims.ckpt")
    # One readable line: counts and a few names, not torch's list of every tensor.
    message = str(refused.value)
    assert "tensors of another shape (" in message and "\n" not in message
    assert "(32,) in the checkpoint, (64,) in the model" in message
    assert len(message) < 600, message

    no_vocabulary = {k: v for k, v in checkpoint.items() if k != "vocabulary"}
    save_atomically(no_vocabulary, tmp_path / "novocab.ckpt")
    with pytest.raises(IncompatibleCheckpointError, match="vocabulary"):
        Captioner.load(tmp_path / "novocab.ckpt")

    with pytest.raises(FileNotFoundError, match="missing.ckpt"):
        Captioner.load(tmp_path / "missing.ckpt")


def test_checkpoints_with_pickled_code_are_not_loaded(tmp_path):
    path = tmp_path / "pickled.ckpt"
    torch.save({"state_dict": {}, "evil": Path("x")}, path)  # a non-allowlisted class
    with pytest.raises(ValueError, match="pickled.ckpt"):
        Captioner.load(path)


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_checkpoint_errors_name_the_file_and_the_problem(tmp_path):
    from captioner.checkpointing import CheckpointError

    (tmp_path / "folder.ckpt").mkdir()
    (tmp_path / "empty.ckpt").write_bytes(b"")
    (tmp_path / "text.ckpt").write_text("not a checkpoint")
    torch.save({"state_dict": {"w": torch.ones(3)}}, tmp_path / "whole.ckpt")
    whole = (tmp_path / "whole.ckpt").read_bytes()
    (tmp_path / "truncated.ckpt").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "random.ckpt").write_bytes(bytes(range(256)) * 8)
    (tmp_path / "plain.pkl").write_bytes(pickle.dumps({"a": 1}, protocol=4))
    marker = tmp_path / "code-ran"
    torch.save({"state_dict": {}, "payload": _RunsCode(marker)}, tmp_path / "evil.ckpt")
    cases = {
        "folder.ckpt": "is a folder, not a checkpoint file",
        "empty.ckpt": "is empty (0 bytes), not a checkpoint",
        "text.ckpt": "not a torch checkpoint (neither the zip archive that torch.save writes "
                     "nor pickle data)",
        "truncated.ckpt": "not a torch checkpoint (a truncated or damaged zip archive)",
        "random.ckpt": "not a torch checkpoint (neither the zip archive",
        "plain.pkl": "not a torch checkpoint (pickle data it cannot read: ",
        "evil.ckpt": "holds objects other than tensors and plain data",
    }
    for name, message in cases.items():
        with pytest.raises(CheckpointError) as error:
            Captioner.load(tmp_path / name)
        assert f"{tmp_path / name}: {message}" in str(error.value)
        assert "weights_only" not in str(error.value)  # never advise unpickling the file
    assert not marker.exists()
