"""Output mappings and caption losses vs. hand-computed values and the entmax package."""

from __future__ import annotations

import entmax
import pytest
import torch

from captioner.model.losses import (
    caption_loss,
    fenchel_young_loss,
    word_log_probs,
    word_probabilities,
)


def test_sparsemax_loss_hand_computed():
    # Martins & Astudillo Eq. 20: z = (1, 0, -1) has sparsemax (1, 0, 0) (tau = 0).
    # Gold 0: -1 + (1 - 0) / 2 + 1/2 = 0 (margin z_0 >= 1 + max_j z_j holds);
    # gold 1: -0 + 1/2 + 1/2 = 1; gold 2: 1 + 1/2 + 1/2 = 2.
    scores = torch.tensor([[1.0, 0.0, -1.0]] * 3)
    loss = fenchel_young_loss(scores, torch.tensor([0, 1, 2]), alpha=2.0)
    torch.testing.assert_close(loss, torch.tensor([0.0, 1.0, 2.0]))


def test_entmax15_loss_hand_computed():
    # Two equal scores: 1.5-entmax gives (1/2, 1/2); H_1.5 = 4/3 * sum(p - p^1.5)
    # = 4/3 * (1 - 2 * 0.5 ** 1.5); z . p - z_y = 0.
    loss = fenchel_young_loss(torch.tensor([[0.3, 0.3]]), torch.tensor([1]), alpha=1.5)
    expected = 4.0 / 3.0 * (1.0 - 2.0 * 0.5**1.5)
    torch.testing.assert_close(loss, torch.tensor([expected]))


@pytest.mark.parametrize(
    ("mapping", "reference"),
    [("sparsemax", entmax.SparsemaxLoss), ("entmax15", entmax.Entmax15Loss)],
)
def test_fenchel_young_losses_match_entmax_package(mapping, reference):
    torch.manual_seed(0)
    scores = torch.randn(3, 5, 40) * 3
    targets = torch.randint(4, 40, (3, 5))
    targets[0, 3:] = 0  # padding
    ours_scores = scores.clone().requires_grad_()
    ours = caption_loss(ours_scores, targets, output_mapping=mapping, pad_id=0)
    ours.backward()

    keep = targets != 0
    ref_scores = scores.clone().requires_grad_()
    ref = reference(reduction="sum")(ref_scores[keep], targets[keep]) / keep.sum()
    ref.backward()
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(ours_scores.grad, ref_scores.grad)


def test_fenchel_young_gradient_is_p_minus_onehot():
    torch.manual_seed(1)
    scores = (torch.randn(6, 12) * 2).requires_grad_()
    targets = torch.randint(0, 12, (6,))
    fenchel_young_loss(scores, targets, alpha=2.0).sum().backward()
    expected = entmax.sparsemax(scores.detach(), dim=-1)
    expected[torch.arange(6), targets] -= 1
    torch.testing.assert_close(scores.grad, expected)


def test_softmax_loss_is_cross_entropy_over_non_pad_tokens():
    torch.manual_seed(2)
    scores = torch.randn(2, 4, 9)
    targets = torch.tensor([[5, 6, 2, 0], [7, 2, 0, 0]])
    log_probs = torch.log_softmax(scores, -1)
    by_hand = (
        -(
            log_probs[0, 0, 5]
            + log_probs[0, 1, 6]
            + log_probs[0, 2, 2]
            + log_probs[1, 0, 7]
            + log_probs[1, 1, 2]
        )
        / 5
    )
    torch.testing.assert_close(caption_loss(scores, targets), by_hand)


def test_sparse_word_log_probs_are_minus_inf_where_probability_is_zero():
    scores = torch.tensor([[3.0, 2.9, -4.0, -5.0]])
    probs = word_probabilities(scores, "sparsemax")
    torch.testing.assert_close(probs, entmax.sparsemax(scores, dim=-1))
    log_probs = word_log_probs(scores, "sparsemax")
    assert torch.equal(torch.isinf(log_probs), probs == 0)
    assert torch.isinf(log_probs[0, 2:]).all() and torch.isfinite(log_probs[0, :2]).all()
    torch.testing.assert_close(
        word_log_probs(scores, "entmax15").exp(), entmax.entmax15(scores, dim=-1)
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(output_mapping="tvmax"), "unknown output_mapping 'tvmax'"),
        (dict(targets=torch.zeros(2, 3, dtype=torch.long)), "every target is the pad id"),
        (dict(targets=torch.full((2, 3), 9)), "target ids must lie in"),
        (dict(targets=torch.ones(2, 4, dtype=torch.long)), "targets (B, L)"),
        (dict(targets=torch.ones(2, 3)), "must be torch.long"),
    ],
)
def test_caption_loss_rejects_bad_input(kwargs, message):
    arguments = dict(scores=torch.randn(2, 3, 9), targets=torch.ones(2, 3, dtype=torch.long))
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        caption_loss(**arguments)
