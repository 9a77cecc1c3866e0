"""Checksums verified on read: a checkpoint whose zip CRC-32 fails, and a feature cache whose
rows fail theirs, are refused in one line naming the file (and the image, for a cache)."""

from __future__ import annotations

import re
import shutil
import struct
import zipfile

import h5py
import numpy as np
import pytest
import robust_inputs as bad

from captioner.checkpointing import AtomicCheckpointIO, CheckpointError
from data_prep.features import FeatureCache, FeatureCacheWriter

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


# ------------------------------------------------------------------------------ feature cache

ENCODER = ["--arch", "resnet18", "--layer", "layer3", "--image-size", "32", "--batch-size", "8",
           "--num-workers", "0", "--no-progress", "--device", "cpu"]


def _small_cache(path, ids=(7, 8, 9)):
    rng = np.random.default_rng(0)
    with FeatureCacheWriter(path, grid=(2, 2), channels=4, encoder={"arch": "test"}) as writer:
        writer.add(list(ids), rng.standard_normal((len(ids), 2, 2, 4)).astype(np.float32))
    return path


def _flip_a_bit_of_the_row(path, row):
    """Flip one mantissa bit in the stored chunk of ``row``, where HDF5's own index says it
    lies (h5py's public low-level chunk query)."""
    with h5py.File(path, "r") as file:
        info = file["features"].id.get_chunk_info_by_coord((row, 0, 0, 0))
    with open(path, "r+b") as handle:
        handle.seek(info.byte_offset + 4)
        byte = handle.read(1)
        handle.seek(-1, 1)
        handle.write(bytes([byte[0] ^ 0x01]))


def test_a_cache_row_with_a_flipped_bit_is_refused_naming_file_and_image(tmp_path):
    cache_path = _small_cache(tmp_path / "f.h5")
    _flip_a_bit_of_the_row(cache_path, 1)
    cache = FeatureCache(cache_path)
    assert cache.get(7).shape == (2, 2, 4)  # the other rows still read
    with pytest.raises(ValueError, match=re.escape(f"{cache_path}: the features of image id 8 "
                                                   "are damaged (it cannot be read")):
        cache.get_many([7, 8])


def test_a_cache_row_rewritten_without_its_checksum_is_refused(tmp_path):
    # Written through HDF5, which recomputes the chunk's Fletcher-32: the row checksum differs.
    cache_path = _small_cache(tmp_path / "f.h5")
    with h5py.File(cache_path, "r+") as file:
        file["features"][2, 0, 0, 0] = 32768
    with pytest.raises(ValueError, match=re.escape(f"{cache_path}: the features of image id 9 "
                                                   "are damaged (it fails its checksum")):
        FeatureCache(cache_path).get(9)


def test_a_cache_row_moved_to_another_image_is_refused(tmp_path):
    # Rows 0 and 1 swapped with their checksums but not their ids: each chunk and each stored
    # checksum is whole, and each row now stands for another image.
    cache_path = _small_cache(tmp_path / "f.h5")
    with h5py.File(cache_path, "r+") as file:
        for name in ("features", "row_crc32"):
            first, second = file[name][0], file[name][1]
            file[name][0], file[name][1] = second, first
    with pytest.raises(ValueError, match="image id 7 are damaged .it fails its checksum"):
        FeatureCache(cache_path).get(7)


def test_prepare_features_refuses_a_cache_made_by_weights_replaced_since(
        tmp_path, capsys):
    images = tmp_path / "images"
    images.mkdir()
    records = []
    for i in range(3):
        bad.write_png(images / f"{i}.png", seed=i)
        records.append(bad.karpathy_record(f"{i}.png", i, "train" if i < 2 else "test"))
    data = bad.write_karpathy(tmp_path / "dataset.json", records)
    weights = bad.write_foreign_state_dict(tmp_path / "encoder.pt")
    out = tmp_path / "f.h5"
    argv = ["prepare-features", "--data", data, "--images", images, "--out", out,
            "--weights", weights, *ENCODER]
    assert bad.run_cli(capsys, argv).code == 0
    bad.write_foreign_state_dict(weights)  # other random weights under the same path
    outcome = bad.run_cli(capsys, argv)
    bad.assert_user_error(outcome, "prepare-features", str(out),
                          "made with other settings (the weights file's content (SHA-256")
