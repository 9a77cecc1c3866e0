"""HDF5 feature cache: round trip, atomic writes, validation, missing keys, resumable writes,
skipped images."""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

import data_prep.features as features_module
from data_prep.features import (
    FeatureCache,
    FeatureCacheWriter,
    PartialCacheInUseError,
    partial_cache_path,
    partial_resume_key,
    skipped_images_path,
)

GRID = (2, 3)
CHANNELS = 4
ENCODER = {"arch": "resnet18", "weights": None, "image_size": 64}


def _features(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, *GRID, CHANNELS)).astype(np.float16)


def _writer(path):
    return FeatureCacheWriter(path, grid=GRID, channels=CHANNELS, encoder=ENCODER)


def test_round_trip(tmp_path):
    path = tmp_path / "features.h5"
    first, second = _features(3, 0), _features(2, 1)
    with _writer(path) as writer:
        writer.add([10, 20, 30], first)
        writer.add(np.array([7, 5]), second.astype(np.float32))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["features.h5"]

    cache = FeatureCache(path)
    assert cache.encoder == ENCODER
    assert cache.grid == GRID and cache.channels == CHANNELS
    assert len(cache) == 5 and 20 in cache and 11 not in cache
    assert cache.image_ids == [10, 20, 30, 7, 5]
    got = cache.get(20)
    assert got.dtype == np.float16 and got.shape == (*GRID, CHANNELS)
    assert np.array_equal(got, first[1])
    assert np.array_equal(cache.get(5), second[1])
    many = cache.get_many([5, 10, 5, 30])
    assert np.array_equal(many, np.stack([second[1], first[0], second[1], first[2]]))
    assert cache.get_many([]).shape == (0, *GRID, CHANNELS)
    # A copy handed to a DataLoader worker reopens the file itself.
    assert np.array_equal(pickle.loads(pickle.dumps(cache)).get(30), first[2])
    cache.close()


def test_file_is_plain_hdf5_with_documented_layout(tmp_path):
    path = tmp_path / "features.h5"
    with _writer(path) as writer:
        writer.add([4], _features(1, 2))
    with h5py.File(path, "r") as file:
        assert file["features"].dtype == np.float16
        assert file["features"].shape == (1, *GRID, CHANNELS)
        assert file["image_ids"][:].tolist() == [4]
        assert tuple(file.attrs["grid"]) == GRID


def test_image_names_are_recorded_and_kept_by_a_resumed_write(tmp_path):
    path = tmp_path / "features.h5"
    names = {4: "train2014/a.jpg", 9: "val2014/b 1.jpg"}
    with FeatureCacheWriter(path, grid=GRID, channels=CHANNELS, encoder=ENCODER,
                            names=names) as writer:
        writer.add([4, 9], _features(2, 2))
    assert FeatureCache(path).image_names() == names
    with h5py.File(path, "r") as file:  # plain JSON, readable without the project
        assert json.loads(file["image_names"][()]) == {"4": "train2014/a.jpg",
                                                       "9": "val2014/b 1.jpg"}
    # A resumed write keeps the names of the partial file it continues.
    key = {"images": [4, 9]}
    resumable = tmp_path / "resumed.h5"
    writer = FeatureCacheWriter(resumable, grid=GRID, channels=CHANNELS, encoder=ENCODER,
                                names=names, resume_key=key)
    with pytest.raises(RuntimeError):
        with writer:
            writer.add([4], _features(1, 2))
            writer.commit()
            raise RuntimeError("interrupted")
    with FeatureCacheWriter(resumable, grid=GRID, channels=CHANNELS, encoder=ENCODER,
                            names=names, resume_key=key) as writer:
        assert writer.restarted is None and writer.done == 1
        writer.add([9], _features(1, 3))
    assert FeatureCache(resumable).image_names() == names
    # Caches written before names were recorded have none.
    with _writer(tmp_path / "old.h5") as writer:
        writer.add([4], _features(1, 2))
    assert FeatureCache(tmp_path / "old.h5").image_names() is None


def test_a_resumable_write_stopped_before_any_commit_leaves_no_partial_file(tmp_path):
    """An empty partial file would refuse a rerun with other settings (after weights that give
    non-finite features, say), a trap with nothing in it to keep; one with committed rows is
    kept, also when a later run adds nothing before it stops."""
    path = tmp_path / "features.h5"

    def stopped(key, rows):
        with pytest.raises(RuntimeError, match="stopped"):
            with FeatureCacheWriter(path, grid=GRID, channels=CHANNELS, encoder=ENCODER,
                                    resume_key=key) as writer:
                if rows:
                    writer.add(list(range(rows)), _features(rows, 0))
                    writer.commit()
                writer.add([99], _features(1, 1))  # not committed
                raise RuntimeError("stopped")

    stopped({"images": 1}, rows=0)
    assert list(tmp_path.iterdir()) == []
    stopped({"images": 2}, rows=2)  # other settings: not refused
    assert partial_resume_key(path) == {"images": 2}
    stopped({"images": 2}, rows=0)
    assert partial_resume_key(path) == {"images": 2}


def test_missing_id_names_id_and_file(tmp_path):
    path = tmp_path / "features.h5"
    with _writer(path) as writer:
        writer.add([1], _features(1, 0))
    with FeatureCache(path) as cache, pytest.raises(KeyError, match=r"image id 99 .*features.h5"):
        cache.get(99)


def test_no_file_is_left_after_an_exception(tmp_path):
    path = tmp_path / "features.h5"
    with pytest.raises(RuntimeError, match="encoder crashed"), _writer(path) as writer:
        writer.add([1, 2], _features(2, 0))
        raise RuntimeError("encoder crashed")
    assert list(tmp_path.iterdir()) == []


def test_an_existing_cache_survives_a_failed_rewrite(tmp_path):
    path = tmp_path / "features.h5"
    with _writer(path) as writer:
        writer.add([1], _features(1, 0))
    with pytest.raises(ValueError), _writer(path) as writer:
        writer.add([2], _features(2, 0))  # wrong batch size
    assert FeatureCache(path).image_ids == [1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["features.h5"]


@pytest.mark.parametrize(
    ("ids", "feats", "error", "message"),
    [
        ([1, 2], np.zeros((2, 3, 2, CHANNELS), np.float16), ValueError, r"shape"),
        ([1], np.zeros((1, *GRID, CHANNELS), np.int32), TypeError, "floating point"),
        ([1, 1], np.zeros((2, *GRID, CHANNELS), np.float16), ValueError,
         r"already written to .*: 1$"),
        ([3], np.zeros((1, *GRID, CHANNELS), np.float16), ValueError,
         r"already written to .*: 3$"),
        ([8], np.full((1, *GRID, CHANNELS), 1e6, np.float32), ValueError,
         r"^features of image ids 8 are not finite"),
        (["x"], np.zeros((1, *GRID, CHANNELS), np.float16), TypeError, "integers"),
    ],
)
def test_add_validates(tmp_path, ids, feats, error, message):
    with _writer(tmp_path / "f.h5") as writer:
        writer.add([3], _features(1, 0))
        with pytest.raises(error, match=message):
            writer.add(ids, feats)


def test_constructor_validates():
    with pytest.raises(ValueError, match="grid"):
        FeatureCacheWriter("x.h5", grid=(8,), channels=4, encoder={})
    with pytest.raises(ValueError, match="channels"):
        FeatureCacheWriter("x.h5", grid=(8, 8), channels=0, encoder={})
    with pytest.raises(ValueError, match="JSON"):
        FeatureCacheWriter("x.h5", grid=(8, 8), channels=4, encoder={"f": object()})
    with pytest.raises(RuntimeError, match="with"):
        FeatureCacheWriter("x.h5", grid=(8, 8), channels=4, encoder={}).add([1], np.zeros(1))


def test_reading_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="absent.h5"):
        FeatureCache(tmp_path / "absent.h5")
    (tmp_path / "text.h5").write_text("not hdf5")
    with pytest.raises(ValueError, match="text.h5.*not a readable HDF5"):
        FeatureCache(tmp_path / "text.h5")
    with h5py.File(tmp_path / "other.h5", "w") as file:
        file["x"] = np.zeros(3)
    with pytest.raises(ValueError, match="other.h5.*not a feature cache"):
        FeatureCache(tmp_path / "other.h5")


def _ids(*ids, dtype=np.int64):
    return np.array(ids, dtype=dtype)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        pytest.param("features", np.zeros((3, *GRID, 2), np.float16),
                     "dataset 'features' has shape (3, 2, 3, 2), but attributes grid and "
                     "channels say (N, 2, 3, 4)", id="features-channels"),
        pytest.param("features", np.zeros((3, 1, 3, CHANNELS), np.float16),
                     "dataset 'features' has shape (3, 1, 3, 4)", id="features-grid"),
        pytest.param("features", np.array([b"x"] * 3), "dataset 'features' has dtype",
                     id="features-strings"),
        pytest.param("features", np.zeros((3, *GRID, CHANNELS), np.int8),
                     "dataset 'features' has dtype int8", id="features-int8"),
        pytest.param("features", np.zeros((3, *GRID, CHANNELS), np.float32),
                     "dataset 'features' has dtype float32", id="features-float32"),
        pytest.param("image_ids", _ids(1, 2, 3, 4), "dataset 'image_ids' has 4 ids, but dataset "
                     "'features' has 3 rows", id="ids-longer"),
        pytest.param("image_ids", _ids(1, 2, 3, 4, 5, 6).reshape(3, 2),
                     "dataset 'image_ids' must hold integers of shape (N,)", id="ids-2d"),
        pytest.param("image_ids", _ids(5, 2, 5), "dataset 'image_ids' holds image id 5 twice",
                     id="ids-duplicate"),
        pytest.param("image_ids", _ids(1, 2, 71.5, dtype=np.float64),
                     "dataset 'image_ids' must hold integers", id="ids-float"),
        pytest.param("grid", 8, "attribute 'grid' must be 2 positive integers, got 8",
                     id="grid-scalar"),
        pytest.param("grid", [-2, 3], "attribute 'grid' must be 2 positive integers",
                     id="grid-negative"),
        pytest.param("channels", "abc", "attribute 'channels' must be a positive integer, "
                     "got 'abc'", id="channels-text"),
        pytest.param("encoder", "[1, 2]", "attribute 'encoder' must be a JSON object, got a list",
                     id="encoder-list"),
        pytest.param("encoder", "arch=resnet", "attribute 'encoder' is not valid JSON",
                     id="encoder-not-json"),
        pytest.param("resume_key", "[1]", "attribute 'resume_key' must be a JSON object",
                     id="resume-key-list"),
        pytest.param("skipped_ids", "", "attribute 'skipped_ids' is not valid JSON",
                     id="skipped-not-json"),
        pytest.param("skipped_ids", '[3, "4"]', "attribute 'skipped_ids' holds '4', not an "
                     "image id", id="skipped-text"),
        pytest.param("image_names", "{", "dataset 'image_names' is not valid JSON",
                     id="names-not-json"),
        pytest.param("image_names", '["a.jpg"]', "dataset 'image_names' must be a JSON object",
                     id="names-list"),
        pytest.param("image_names", '{"x": "a.jpg"}', "dataset 'image_names' has key 'x'",
                     id="names-key"),
        pytest.param("image_names", '{"1": 5}', "dataset 'image_names' gives image id 1 the "
                     "name 5", id="names-value"),
    ],
)
def test_a_damaged_cache_is_refused_naming_the_file_and_field(tmp_path, name, value, message):
    path = tmp_path / "features.h5"
    with FeatureCacheWriter(path, grid=GRID, channels=CHANNELS, encoder=ENCODER,
                            names={1: "a.jpg", 2: "b.jpg", 3: "c.jpg"}) as writer:
        writer.add([1, 2, 3], _features(3, 0))
    with h5py.File(path, "a") as file:
        if name in file:  # a dataset: replaced
            del file[name]
            file[name] = value
        else:
            file.attrs[name] = value
    with pytest.raises(ValueError) as caught:
        cache = FeatureCache(path)
        if name == "image_names":  # read when asked for
            cache.image_names()
    assert str(caught.value).startswith(f"{path}: ")
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_features_holding_nan_or_inf_are_refused_naming_the_image(tmp_path):
    # The writer refuses them, so the file is damaged; the model would fail on NaN scores that
    # name neither the file nor the image.
    path = tmp_path / "features.h5"
    with _writer(path) as writer:
        writer.add([1, 2, 3], _features(3, 0))
    for bad in (np.nan, np.inf):
        with h5py.File(path, "a") as file:
            file["features"][1, 0, 0, 0] = bad
        cache = FeatureCache(path)
        assert cache.get_many([1, 3]).shape[0] == 2  # the others read as before
        damaged = (f"^{re.escape(str(path))}: dataset 'features' holds NaN or inf in the row "
                   "of image id 2: the cache is damaged")
        with pytest.raises(ValueError, match=damaged):
            cache.get_many([3, 2])
        with pytest.raises(ValueError, match=damaged):
            cache.get(2)
        cache.close()


KEY = {"settings": {"arch": "resnet18"}, "images": [1, 2, 3, 4, 5]}


def _resumable(path, key=KEY, encoder=ENCODER):
    return FeatureCacheWriter(path, grid=GRID, channels=CHANNELS, encoder=encoder,
                              resume_key=key)


def _attrs(path) -> dict:
    with h5py.File(path, "r") as file:
        return {key: np.asarray(value).tolist() for key, value in file.attrs.items()}


def test_resumable_writer_continues_from_the_committed_rows(tmp_path):
    feats = _features(5, 0)
    straight = tmp_path / "straight" / "features.h5"
    with _resumable(straight) as writer:
        writer.add([1, 2], feats[:2])
        writer.skip(3, "images/3.jpg", "file not found")
        writer.add([4, 5], feats[3:])
        assert writer.restarted is None and writer.done == 5

    path = tmp_path / "features.h5"
    partial = partial_cache_path(path)
    with pytest.raises(KeyboardInterrupt), _resumable(path) as writer:
        writer.add([1, 2], feats[:2])
        writer.skip(3, "images/3.jpg", "file not found")
        writer.commit()
        writer.add([4], feats[3:4])  # not committed: dropped on resume
        raise KeyboardInterrupt
    assert partial.is_file() and not path.exists()
    assert partial_resume_key(path) == KEY

    with _resumable(path) as writer:
        assert writer.restarted is None
        assert (writer.done, writer.rows) == (3, 2)
        assert writer.skipped == [{"id": 3, "path": "images/3.jpg", "reason": "file not found"}]
        writer.add([4, 5], feats[3:])
    assert not partial.exists()
    cache = FeatureCache(path)
    assert cache.image_ids == [1, 2, 4, 5] and cache.skipped_ids == [3]
    assert np.array_equal(cache.get_many([1, 2, 4, 5]), feats[[0, 1, 3, 4]])
    assert _attrs(path) == _attrs(straight)
    assert json.loads(skipped_images_path(path).read_text()) == [
        {"id": 3, "path": "images/3.jpg", "reason": "file not found"}]


def _interrupted_after_two_rows(path):
    """A resumable write of ``path`` interrupted (Ctrl-C) after committing ids 1 and 2;
    returns its partial file."""
    with pytest.raises(KeyboardInterrupt), _resumable(path) as writer:
        writer.add([1, 2], _features(2, 0))
        writer.commit()
        raise KeyboardInterrupt
    return partial_cache_path(path)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ("key", "was made with other settings or for other images"),
        ("encoder", "was made by another encoder"),
        ("checksum", "is damaged (checksum of its committed rows differs)"),
        ("rows", "is damaged (it commits 2 rows but holds 1)"),
        ("garbage", "cannot be read"),
    ],
)
def test_an_unusable_partial_file_is_replaced_and_says_why(tmp_path, change, reason):
    path = tmp_path / "features.h5"
    partial = _interrupted_after_two_rows(path)
    key, encoder = KEY, ENCODER
    if change == "key":
        key = {**KEY, "images": [1, 2, 3]}
    elif change == "encoder":
        encoder = {**ENCODER, "image_size": 32}
    elif change == "garbage":
        partial.write_bytes(b"\0" * 1000)
    else:
        with h5py.File(partial, "a") as file:
            if change == "checksum":
                file["features"][1, 0, 0, 0] += 1
            else:
                file["features"].resize(1, axis=0)
    with _resumable(path, key=key, encoder=encoder) as writer:
        assert writer.restarted == reason or writer.restarted.startswith(reason)
        assert writer.done == 0
        writer.add([7], _features(1, 1))
    assert FeatureCache(path).image_ids == [7]


def test_skipped_images_and_sidecar(tmp_path):
    path = tmp_path / "features.h5"
    sidecar = skipped_images_path(path)
    assert sidecar.name == "features.skipped.json"
    with _writer(path) as writer:
        writer.skip(9, "a/9.jpg", "is empty (0 bytes)")
        writer.add([1], _features(1, 0))
        with pytest.raises(ValueError, match=r"already written to .*: 9$"):
            writer.skip(9, "a/9.jpg", "again")
        with pytest.raises(ValueError, match=r"already written to .*: 1$"):
            writer.skip(1, "a/1.jpg", "again")
    assert FeatureCache(path).skipped_ids == [9]
    assert json.loads(sidecar.read_text())[0]["id"] == 9
    with _writer(path) as writer:  # rewritten without skipped images: no stale sidecar
        writer.add([1], _features(1, 0))
    assert FeatureCache(path).skipped_ids == [] and not sidecar.exists()
    with h5py.File(path, "a") as file:  # a cache of an older version has no attribute
        del file.attrs["skipped_ids"]
    assert FeatureCache(path).skipped_ids == []


def test_cache_files_follow_the_umask(tmp_path):
    previous = os.umask(0o027)
    try:
        with _resumable(tmp_path / "features.h5") as writer:
            writer.skip(2, "x.jpg", "file not found")
            writer.add([1], _features(1, 0))
    finally:
        os.umask(previous)
    assert (tmp_path / "features.h5").stat().st_mode & 0o777 == 0o640
    assert skipped_images_path(tmp_path / "features.h5").stat().st_mode & 0o777 == 0o640


def test_commit_needs_a_resume_key(tmp_path):
    with _writer(tmp_path / "f.h5") as writer, pytest.raises(RuntimeError, match="resume_key"):
        writer.commit()
    assert partial_resume_key(tmp_path / "f.h5") is None
    partial_cache_path(tmp_path / "f.h5").write_text("not hdf5")
    assert partial_resume_key(tmp_path / "f.h5") is None


def test_rows_after_the_last_commit_never_reach_the_cache(tmp_path):
    path = tmp_path / "features.h5"
    with pytest.raises(KeyboardInterrupt), _resumable(path) as writer:
        writer.add([1, 2], _features(2, 0))
        writer.commit()
        writer.add([3], _features(1, 1))
        raise KeyboardInterrupt
    with _resumable(path) as writer:
        assert writer.rows == 2
    assert FeatureCache(path).image_ids == [1, 2]


@pytest.mark.subprocess
def test_a_lock_that_another_process_drops_soon_is_waited_for(tmp_path):
    # A loader worker forked while the file was open drops its lock when it notices that its
    # parent was killed: the rerun right after a kill -9 must wait for it, not refuse.
    path = tmp_path / "features.h5"
    partial = _interrupted_after_two_rows(path)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time, h5py; f = h5py.File(sys.argv[1], 'a'); "
         "print('open', flush=True); time.sleep(1.5)", str(partial)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline() == "open\n"
        start = time.monotonic()
        assert partial_resume_key(path) is not None
        assert time.monotonic() - start > 0.5  # it did wait for the lock
    finally:
        holder.communicate()


@pytest.mark.subprocess
def test_a_partial_file_written_by_another_process_is_left_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(features_module, "IN_USE_WAIT_SECONDS", 0.5)
    path = tmp_path / "features.h5"
    partial = _interrupted_after_two_rows(path)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, h5py; f = h5py.File(sys.argv[1], 'a'); "
         "print('open', flush=True); sys.stdin.read()", str(partial)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline() == "open\n"
        with pytest.raises(PartialCacheInUseError, match="open in another process"):
            partial_resume_key(path)
        with pytest.raises(PartialCacheInUseError, match="open in another process"):
            _resumable(path).__enter__()
    finally:
        holder.communicate("")
    with _resumable(path) as writer:
        assert writer.restarted is None and writer.rows == 2
