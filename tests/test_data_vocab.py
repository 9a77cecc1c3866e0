"""Vocabulary: minimum count, deterministic order, encode/decode, dict round trip."""

from __future__ import annotations

import json

import pytest

from data_prep.vocab import END_ID, PAD_ID, START_ID, UNK_ID, Vocabulary

CAPTIONS = [
    ["a", "red", "circle"],
    ["a", "blue", "square"],
    ["a", "red", "square"],
    ["the", "blue", "circle"],
    ["a", "zebra"],
    ["<unk>", "a"],
]


def test_special_ids_are_fixed():
    vocab = Vocabulary.build([], min_count=1)
    assert vocab.itos == ["<pad>", "<start>", "<end>", "<unk>"]
    assert (PAD_ID, START_ID, END_ID, UNK_ID) == (0, 1, 2, 3)
    assert vocab.stoi["<end>"] == END_ID


def test_min_count_and_order_by_frequency_then_alphabet():
    # counts: a 5, blue 2, circle 2, red 2, square 2, the 1, zebra 1; "<unk>" is not a word.
    vocab = Vocabulary.build(CAPTIONS, min_count=2)
    assert vocab.itos[4:] == ["a", "blue", "circle", "red", "square"]
    assert len(vocab) == 9
    assert Vocabulary.build(CAPTIONS, min_count=5).itos[4:] == ["a"]
    assert Vocabulary.build(CAPTIONS).itos[4:] == ["a"]  # default min_count is 5
    assert Vocabulary.build(reversed(CAPTIONS), min_count=1) == Vocabulary.build(
        CAPTIONS, min_count=1
    )


def test_encode_maps_rare_words_to_unk_and_decode_stops_at_end():
    vocab = Vocabulary.build(CAPTIONS, min_count=2)
    ids = vocab.encode(["a", "red", "zebra"])
    assert ids == [4, 7, UNK_ID]
    assert vocab.decode([START_ID, *ids, END_ID, 5, PAD_ID]) == ["a", "red", "<unk>"]
    assert vocab.decode([START_ID, 4, PAD_ID, 6]) == ["a", "circle"]
    with pytest.raises(ValueError, match="token id 99"):
        vocab.decode([99])


def test_decode_accepts_tensor_ids():
    torch = pytest.importorskip("torch")
    vocab = Vocabulary.build(CAPTIONS, min_count=2)
    assert vocab.decode(torch.tensor([1, 4, 6, 2, 0])) == ["a", "circle"]


def test_dict_round_trip_is_json_safe():
    vocab = Vocabulary.build(CAPTIONS, min_count=1)
    data = json.loads(json.dumps(vocab.to_dict()))
    assert data == vocab.to_dict()
    restored = Vocabulary.from_dict(data)
    assert restored == vocab
    assert restored.stoi == vocab.stoi


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "must be a dict"),
        ({"format": "other", "version": 1, "itos": []}, "'format'"),
        ({"format": "captioner.vocabulary", "version": 7, "itos": []}, "'version'"),
        ({"format": "captioner.vocabulary", "version": 1, "itos": "abc"}, "'itos'"),
        (
            {"format": "captioner.vocabulary", "version": 1, "itos": ["a", "b", "c", "d"]},
            "special tokens",
        ),
        (
            {
                "format": "captioner.vocabulary",
                "version": 1,
                "itos": ["<pad>", "<start>", "<end>", "<unk>", "cat", "cat"],
            },
            "vocabulary has duplicate words: cat$",
        ),
        (
            {
                "format": "captioner.vocabulary",
                "version": 1,
                "itos": ["<pad>", "<start>", "<end>", "<unk>", 5],
            },
            "word 4",
        ),
        (  # a caption written with it would break over two lines
            {
                "format": "captioner.vocabulary",
                "version": 1,
                "itos": ["<pad>", "<start>", "<end>", "<unk>", "a\nb"],
            },
            r"vocabulary word 4 must be a non-empty word without whitespace, got 'a\\nb'",
        ),
    ],
)
def test_from_dict_rejects_malformed(data, message):
    with pytest.raises(ValueError, match=message):
        Vocabulary.from_dict(data)


@pytest.mark.parametrize("min_count", [0, -1, 2.5, True])
def test_min_count_must_be_positive_int(min_count):
    with pytest.raises(ValueError, match="min_count"):
        Vocabulary.build(CAPTIONS, min_count=min_count)
