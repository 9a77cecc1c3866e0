"""Greedy and beam search: equivalences, attention through back-pointers, blocking, sparsity."""

from __future__ import annotations

import pytest
import torch
from test_model import random_batch, small_decoder

from captioner.model.decoding import beam_search, greedy_search, trigram_block_mask
from captioner.model.losses import word_log_probs

START, END, MAX_LENGTH = 1, 2, 9


def ending_decoder(output_attention="sparsemax", seed=0):
    """A random decoder whose end token is likely enough that captions differ in length."""
    decoder = small_decoder("softmax", output_attention).eval()
    with torch.no_grad():
        torch.manual_seed(seed)
        decoder.word_scores.weight.mul_(8)
        decoder.word_scores.bias[END] += 1.5
    return decoder


def constant_decoder(bias: dict[int, float], default: float = -5.0):
    """A decoder whose word scores are ``bias`` at every step, whatever the image."""
    decoder = small_decoder().eval()
    with torch.no_grad():
        decoder.word_scores.weight.zero_()
        decoder.word_scores.bias.fill_(default)
        for word, value in bias.items():
            decoder.word_scores.bias[word] = value
    return decoder


def repeated_trigrams(tokens: list[int]) -> bool:
    trigrams = [tuple(tokens[i : i + 3]) for i in range(len(tokens) - 2)]
    return len(trigrams) != len(set(trigrams))


def test_trigram_block_mask_hand_cases():
    history = torch.tensor([[7, 8, 3, 7, 8], [4, 4, 4, 9, 9], [1, 2, 3, 4, 5]])
    mask = trigram_block_mask(history, vocab_size=10)
    assert mask[0].nonzero().flatten().tolist() == [3]  # (7, 8) was followed by 3
    assert mask[1].nonzero().flatten().tolist() == []  # (9, 9) never seen before
    assert mask[2].nonzero().flatten().tolist() == []
    assert trigram_block_mask(torch.tensor([[4, 4, 4]]), 10)[0].nonzero().flatten().tolist() == [4]
    assert not trigram_block_mask(torch.tensor([[4, 4]]), 10).any()


@pytest.mark.parametrize("output_mapping", ["softmax", "sparsemax", "entmax15"])
@pytest.mark.parametrize("block_trigrams", [False, True])
def test_beam_size_one_equals_greedy(output_mapping, block_trigrams):
    decoder = ending_decoder()
    features, _ = random_batch(batch=6)
    options = dict(start_id=START, end_id=END, max_length=MAX_LENGTH, block_trigrams=block_trigrams)
    greedy = greedy_search(decoder, features, output_mapping=output_mapping, **options)
    beam = beam_search(decoder, features, beam_size=1, output_mapping=output_mapping, **options)
    lengths = {len(h.token_ids) for h in greedy}
    assert min(lengths) < MAX_LENGTH, "the fixture should produce some ended captions"
    for g, b in zip(greedy, beam, strict=True):
        assert g.token_ids == b.token_ids
        assert g.log_prob == pytest.approx(b.log_prob, abs=1e-5)
        torch.testing.assert_close(g.output_attention, b.output_attention)
        torch.testing.assert_close(g.input_attention, b.input_attention)


@pytest.mark.parametrize(
    ("output_attention", "output_mapping"),
    [("sparsemax", "softmax"), ("sparsemax", "sparsemax"), ("tvmax", "softmax")],
)
@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_attention_and_log_prob_match_a_teacher_forced_rerun(
    output_attention, output_mapping, search
):
    decoder = ending_decoder(output_attention=output_attention)
    features, _ = random_batch(batch=5, seed=3)
    options = dict(start_id=START, end_id=END, max_length=MAX_LENGTH, output_mapping=output_mapping)
    if search == "beam":
        hypotheses = beam_search(decoder, features, beam_size=3, **options)
    else:
        hypotheses = greedy_search(decoder, features, **options)
    for image, hypothesis in enumerate(hypotheses):
        length = len(hypothesis.token_ids)
        assert hypothesis.output_attention.shape == (length, 3, 4)
        assert hypothesis.input_attention.shape == (length, 3, 4)
        ended = length < MAX_LENGTH
        gold = torch.tensor([hypothesis.token_ids + [END] * ended])
        captions = torch.cat([torch.tensor([[START]]), gold[:, :-1]], dim=1)
        with torch.no_grad():
            rerun = decoder(features[image : image + 1], captions)
        torch.testing.assert_close(hypothesis.output_attention, rerun.output_attention[0, :length])
        torch.testing.assert_close(hypothesis.input_attention, rerun.input_attention[0, :length])
        log_probs = word_log_probs(rerun.scores[0], output_mapping)
        expected = log_probs.gather(1, gold.T).sum().item()
        assert hypothesis.log_prob == pytest.approx(expected, abs=1e-4)


def test_beam_search_scores_at_least_as_well_as_greedy_without_normalization():
    decoder = ending_decoder(output_attention="softmax")
    features, _ = random_batch(batch=6, seed=4)
    options = dict(start_id=START, end_id=END, max_length=MAX_LENGTH)
    greedy = greedy_search(decoder, features, **options)
    beam = beam_search(decoder, features, beam_size=4, length_normalization=0.0, **options)
    for g, b in zip(greedy, beam, strict=True):
        assert b.log_prob >= g.log_prob - 1e-5


def test_trigram_blocking_really_blocks():
    # Word 5 always scores best, so without blocking every caption is "5 5 5 ...".
    decoder = constant_decoder({5: 3.0, 6: 2.0, 7: 1.0, END: -3.0})
    features, _ = random_batch(batch=2)
    options = dict(start_id=START, end_id=END, max_length=MAX_LENGTH)
    assert greedy_search(decoder, features, **options)[0].token_ids == [5] * MAX_LENGTH
    for hypothesis in greedy_search(decoder, features, block_trigrams=True, **options):
        assert hypothesis.token_ids[:4] == [5, 5, 5, 6]
        assert not repeated_trigrams(hypothesis.token_ids)
    for hypothesis in beam_search(decoder, features, beam_size=3, block_trigrams=True, **options):
        assert len(hypothesis.token_ids) == MAX_LENGTH
        assert not repeated_trigrams(hypothesis.token_ids)


def test_sparse_outputs_never_expand_zero_probability_words():
    # sparsemax(2, 1.9, 1.5, -5, ...) has support {5, 6, END}: fewer candidates than beams.
    decoder = constant_decoder({5: 2.0, 6: 1.9, END: 1.5})
    features, _ = random_batch(batch=3)
    hypotheses = beam_search(
        decoder,
        features,
        start_id=START,
        end_id=END,
        beam_size=5,
        max_length=MAX_LENGTH,
        output_mapping="sparsemax",
    )
    for hypothesis in hypotheses:
        assert set(hypothesis.token_ids) <= {5, 6}
        assert torch.isfinite(torch.tensor(hypothesis.log_prob))

    # Probability 1 on word 5 and trigram blocking: after "5 5 5" no word is left, so the
    # caption stops there with log-prob 0 (log 1 per word).
    decoder = constant_decoder({5: 10.0})
    options = dict(start_id=START, end_id=END, max_length=MAX_LENGTH, block_trigrams=True)
    for search in (greedy_search, beam_search):
        extra = {"beam_size": 3} if search is beam_search else {}
        for hypothesis in search(decoder, features, output_mapping="sparsemax", **options, **extra):
            assert hypothesis.token_ids == [5, 5, 5]
            assert hypothesis.log_prob == 0.0
            assert hypothesis.output_attention.shape == (3, 3, 4)


def test_length_normalization_and_stopping_rule():
    # Word 5 has probability 0.9 and the end token 0.1 at every step (other words ~0). With
    # 3 beams the search stops once 3 hypotheses have ended: "", "5" and "5 5", with
    # log-probs log .1, log .9 + log .1, 2 log .9 + log .1 over n = 1, 2, 3 scored tokens.
    # Raw log-prob (a = 0) picks "", the mean log-prob (a = 1: -2.30, -1.20, -0.84) "5 5".
    scores = {5: 0.0, END: float(torch.log(torch.tensor(0.1 / 0.9)))}
    decoder = constant_decoder(scores, default=-30.0)
    features, _ = random_batch(batch=1)
    options = dict(start_id=START, end_id=END, beam_size=3, max_length=5)
    raw = beam_search(decoder, features, length_normalization=0.0, **options)[0]
    mean = beam_search(decoder, features, length_normalization=1.0, **options)[0]
    assert raw.token_ids == []
    assert raw.log_prob == pytest.approx(float(torch.log(torch.tensor(0.1))), abs=1e-4)
    assert mean.token_ids == [5, 5]
    assert mean.log_prob == pytest.approx(float(torch.log(torch.tensor(0.9 * 0.9 * 0.1))), abs=1e-4)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(beam_size=0), "beam_size must be >= 1"),
        (dict(max_length=0), "max_length must be >= 1"),
        (dict(start_id=99), "start_id=99 is outside the vocabulary"),
        (dict(length_normalization=-1.0), "length_normalization must be a finite number >= 0"),
        (dict(output_mapping="tvmax"), "unknown output_mapping"),
    ],
)
def test_beam_search_rejects_bad_arguments(kwargs, message):
    arguments = dict(start_id=START, end_id=END, beam_size=2, max_length=4)
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=message):
        beam_search(small_decoder(), random_batch(batch=1)[0], **arguments)


def test_empty_batch_gives_no_hypotheses():
    features = torch.zeros(0, 3, 4, 24)
    options = dict(start_id=START, end_id=END, max_length=4)
    assert beam_search(small_decoder(), features, beam_size=2, **options) == []


def test_float16_cached_features_decode_like_their_float32_values():
    decoder = ending_decoder()
    features = random_batch(batch=3)[0].half()
    options = dict(start_id=START, end_id=END, beam_size=2, max_length=MAX_LENGTH)
    from_half = beam_search(decoder, features, **options)
    from_float = beam_search(decoder, features.float(), **options)
    assert [h.token_ids for h in from_half] == [h.token_ids for h in from_float]


@pytest.mark.parametrize("search", [greedy_search, beam_search])
def test_searches_build_no_autograd_graph(search):
    decoder = ending_decoder("softmax").eval()
    features, _ = random_batch(batch=2, seed=4)
    options = dict(start_id=START, end_id=END, max_length=MAX_LENGTH)
    if search is beam_search:
        options["beam_size"] = 2
    for hypothesis in search(decoder, features, **options):
        assert not hypothesis.output_attention.requires_grad
        assert not hypothesis.input_attention.requires_grad
