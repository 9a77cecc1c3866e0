"""Checksums verified on read: a checkpoint whose zip CRC-32 fails, and a feature cache whose
rows fail theirs, are refused in one line naming the file (and the image, for a cache)."""

from __future__ import annotations

import shutil
import struct
import zipfile

import pytest
import robust_inputs as bad

from captioner.checkpointing import AtomicCheckpointIO, CheckpointError

FAST = ["--beam-size", "1", "--max-length", "4", "--no-progress", "--device", "cpu"]


def _flip_a_byte_of_the_largest_tensor(path):
    """Flip one bit in the middle of the data of the checkpoint's largest tensor, leaving the
    zip archive's structure (and its recorded CRC-32) as it was: the damage a bad disk or a
    bad copy does. Returns the member's name."""
    with zipfile.ZipFile(path) as archive:
        member = max((info for info in archive.infolist() if "/data/" in info.filename),
                     key=lambda info: info.file_size)
    with open(path, "r+b") as handle:
        handle.seek(member.header_offset)
        header = handle.read(30)  # the local file header; its name and extra field follow
        names, extra = struct.unpack("<HH", header[26:30])
        handle.seek(member.header_offset + 30 + names + extra + member.compress_size // 2)
        byte = handle.read(1)
        handle.seek(-1, 1)
        handle.write(bytes([byte[0] ^ 0x10]))
    return member.filename


@pytest.fixture
def damaged_checkpoint(tiny_checkpoint, tmp_path):
    damaged = tmp_path / "damaged.ckpt"
    shutil.copyfile(tiny_checkpoint, damaged)
    member = _flip_a_byte_of_the_largest_tensor(damaged)
    return damaged, member


def test_caption_refuses_a_checkpoint_whose_crc_fails(damaged_checkpoint, tmp_path, capsys):
    ckpt, member = damaged_checkpoint
    image = bad.write_png(tmp_path / "good.png")
    out = tmp_path / "captions.txt"
    outcome = bad.run_cli(capsys, ["caption", image, "--ckpt", ckpt, "--out", out, *FAST])
    bad.assert_user_error(outcome, "caption", str(ckpt), f"{member} fails its CRC-32")
    assert not out.exists()


def test_a_resume_refuses_a_checkpoint_whose_crc_fails(damaged_checkpoint, tiny_checkpoint):
    ckpt, member = damaged_checkpoint
    with pytest.raises(CheckpointError, match=f"damaged .the data of {member} fails"):
        AtomicCheckpointIO().load_checkpoint(ckpt)  # what fit --ckpt_path reads through
    assert AtomicCheckpointIO().load_checkpoint(tiny_checkpoint)["state_dict"]
