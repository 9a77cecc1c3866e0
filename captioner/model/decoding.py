"""Caption decoding: greedy search and batched beam search with per-word attention.

Both run :meth:`AttentionDecoder.step` on every image (and every beam) of a batch at once; no
Python loop over images happens inside a step. Each hypothesis carries the output and input
attention maps of every generated word: beam search reorders the token and attention histories
by the beam back-pointers at every step, so the maps stay aligned with the words of the
surviving beam. An image whose search is over leaves the batch, so that later steps compute
only the images still being searched.

Conventions shared by both searches:

* ``max_length`` counts generated words, the end token excluded. A hypothesis that reaches it
  stops without an end token.
* ``log_prob`` is the sum of the word log-probabilities, the end token's included when the
  hypothesis ended with it.
* With a sparse output mapping (sparsemax, 1.5-entmax) a word of probability 0 has log-prob
  ``-inf`` and is never chosen or expanded. Trigram blocking sets the log-prob of a word that
  would repeat a trigram of the hypothesis to ``-inf`` too. A hypothesis left with no word of
  finite log-prob stops where it is (without an end token).
* ``banned_ids`` are words never generated (their log-prob is set to ``-inf``): a model's
  decoding options ban ``<pad>`` and ``<start>`` always and ``<unk>`` unless allowed.
* Beam search ranks finished hypotheses by length-normalized log-prob,
  ``log_prob / n ** length_normalization`` with n the number of scored tokens (words plus the
  end token when present); 0 disables the normalization, 1 is the mean log-prob. Default:
  :data:`captioner.model.decoding_options.DEFAULT_LENGTH_NORMALIZATION`.
* Only end tokens among the ``beam_size`` best candidates of a step finish a hypothesis, and
  an image is done when it has ``beam_size`` finished hypotheses or no live beam (fairseq's
  rule). Beam size 1 is then exactly greedy search, whatever the length normalization; the
  price is that a longer caption found after that point could have ranked higher.

Call ``decoder.eval()`` first: decoding with dropout active is rarely what is wanted.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from captioner.attention import DeferredChecks
from captioner.model.decoder import AttentionDecoder, EncodedImages
from captioner.model.decoding_options import (
    DEFAULT_LENGTH_NORMALIZATION,
    DecodingOptions,
    check_length_normalization,
)
from captioner.model.losses import word_log_probs
from data_prep.machine import available_memory
from data_prep.vocab import Vocabulary
from data_prep.wording import counted


@dataclass
class Hypothesis:
    """One decoded caption.

    token_ids: word ids without start and end tokens (T of them).
    log_prob: sum of the word log-probabilities (end token included when generated).
    output_attention, input_attention: ``(T, H, W)`` float CPU tensors, one map per word.
    """

    token_ids: list[int]
    log_prob: float
    output_attention: Tensor
    input_attention: Tensor


def trigram_block_mask(history: Tensor, vocab_size: int) -> Tensor:
    """Words that would repeat a trigram: history ``(N, t)`` long -> ``(N, V)`` bool.

    Entry (n, w) is True when (history[n, -2], history[n, -1], w) already occurs in
    ``history[n]``.
    """
    rows, length = history.shape
    counts = torch.zeros(rows, vocab_size, dtype=torch.int32, device=history.device)
    if length >= 3:
        last = history[:, -2:]
        # match[:, j]: the bigram at positions (j, j + 1) equals the last bigram, so the
        # word at j + 2 would complete a repeated trigram.
        match = (history[:, :-2] == last[:, :1]) & (history[:, 1:-1] == last[:, 1:])
        counts.scatter_add_(1, history[:, 2:], match.to(torch.int32))
    return counts > 0


def _check_arguments(
    decoder: AttentionDecoder, start_id: int, end_id: int, max_length: int
) -> None:
    for name, value in (("start_id", start_id), ("end_id", end_id)):
        if not 0 <= value < decoder.vocab_size:
            raise ValueError(f"{name}={value} is outside the vocabulary [0, {decoder.vocab_size})")
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")


def _banned_mask(banned_ids: Sequence[int], vocab_size: int, device) -> Tensor:
    """(V,) bool, True for the words of ``banned_ids``."""
    mask = torch.zeros(vocab_size, dtype=torch.bool)
    for index in banned_ids:
        if not 0 <= index < vocab_size:
            raise ValueError(f"banned id {index} is outside the vocabulary [0, {vocab_size})")
        mask[index] = True
    return mask.to(device)


def _free_memory(device: torch.device) -> int | None:
    """Bytes that ``device`` can still give: CUDA's free memory plus what torch's cache holds
    unused; on Linux, MemAvailable of /proc/meminfo (free pages and reclaimable caches); None
    where neither is known."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return available_memory()


def check_search_memory(encoded: EncodedImages, images: int, beams: int,
                        vocab_size: int) -> None:
    """Raise MemoryError, naming the sizes, when the first step of a beam search of ``images``
    images (``encoded``: at least one of them) surely needs more memory than the device has
    free: each (image, beam) row's copy of the encoded images
    and its scores over the vocabulary (twice: log-probabilities and the expanded beam scores),
    a lower bound. Such a search would otherwise make many allocations that each fit, until
    the machine runs out and Linux's OOM killer ends the process without a word."""
    per_row = sum(t[0].numel() * t.element_size()
                  for t in (encoded.values, encoded.input_keys, encoded.output_keys))
    needed = images * beams * (per_row + 2 * vocab_size * encoded.values.element_size())
    free = _free_memory(encoded.values.device)
    if free is not None and needed > free:
        raise MemoryError(f"a beam search of {beams:,} beams x {counted(images, 'image')} "
                          f"needs {needed / 2**30:.2f} GiB or more, and {free / 2**30:.2f} GiB "
                          "is free")


def _checks_read_once(search):
    """Run ``search`` with its attention checks read back once at the end (one host sync)
    instead of at every step (see attention.DeferredChecks)."""

    @functools.wraps(search)
    def run(*args, **kwargs):
        with DeferredChecks() as checks:
            result = search(*args, **kwargs)
        checks.raise_first()
        return result

    return run


@torch.no_grad()
@_checks_read_once
def greedy_search(
    decoder: AttentionDecoder,
    features: Tensor,
    *,
    start_id: int,
    end_id: int,
    max_length: int,
    block_trigrams: bool = False,
    banned_ids: Sequence[int] = (),
    output_mapping: str = "softmax",
) -> list[Hypothesis]:
    """Pick the most probable word at every step, for all images at once.

    Args:
        decoder: the trained decoder (in eval mode).
        features: ``(B, H, W, C)`` float grid features.
        start_id, end_id: ids of the start and end tokens.
        max_length: most words per caption (end token excluded).
        block_trigrams: never repeat a trigram within a caption.
        banned_ids: words never generated.
        output_mapping: ``"softmax"``, ``"sparsemax"`` or ``"entmax15"``, as trained.

    Returns:
        One :class:`Hypothesis` per image, in input order.
    """
    _check_arguments(decoder, start_id, end_id, max_length)
    banned = _banned_mask(banned_ids, decoder.vocab_size, features.device)
    encoded = decoder.encode(features)
    state = decoder.initial_state(encoded)
    batch = features.shape[0]
    device = features.device
    tokens = torch.full((batch,), start_id, dtype=torch.long, device=device)
    history = torch.zeros(batch, 0, dtype=torch.long, device=device)
    total = torch.zeros(batch, device=device)
    lengths = torch.full((batch,), max_length, dtype=torch.long, device=device)
    running = torch.ones(batch, dtype=torch.bool, device=device)
    output_maps, input_maps = [], []
    for t in range(max_length):
        step = decoder.step(encoded, state, tokens)
        log_probs = word_log_probs(step.scores, output_mapping).masked_fill(banned, float("-inf"))
        if block_trigrams:
            log_probs = log_probs.masked_fill(
                trigram_block_mask(history, decoder.vocab_size), float("-inf")
            )
        best, words = log_probs.max(dim=-1)
        stuck = running & torch.isinf(best)
        ended = running & ~stuck & (words == end_id)
        total = torch.where(running & ~stuck, total + best, total)
        lengths = torch.where(stuck | ended, t, lengths)
        running = running & ~stuck & ~ended
        history = torch.cat([history, words.unsqueeze(1)], dim=1)
        output_maps.append(step.output_attention)
        input_maps.append(step.input_attention)
        tokens, state = words, step.state
        if not bool(running.any()):
            break
    output_attention = torch.stack(output_maps, dim=1).float().cpu()
    input_attention = torch.stack(input_maps, dim=1).float().cpu()
    history, lengths, total = history.cpu(), lengths.cpu().tolist(), total.cpu().tolist()
    return [
        Hypothesis(
            history[i, : lengths[i]].tolist(),
            total[i],
            output_attention[i, : lengths[i]],
            input_attention[i, : lengths[i]],
        )
        for i in range(batch)
    ]


class _FinishedPool:
    """Finished hypotheses of all images, stored in groups of equal length."""

    def __init__(self, batch: int, length_normalization: float, device: torch.device):
        self.groups: list[tuple[Tensor, Tensor, Tensor, Tensor, Tensor, int]] = []
        self.counts = torch.zeros(batch, dtype=torch.long, device=device)
        self.length_normalization = length_normalization

    def add(
        self,
        images: Tensor,
        tokens: Tensor,
        output_attention: Tensor,
        input_attention: Tensor,
        log_probs: Tensor,
        scored_tokens: int,
    ) -> None:
        """images ``(E,)``, tokens ``(E, T)``, attention ``(E, T, H, W)``, log_probs ``(E,)``."""
        if images.numel() == 0:
            return
        self.groups.append(
            (images, tokens, output_attention, input_attention, log_probs, scored_tokens)
        )
        self.counts += torch.bincount(images, minlength=self.counts.numel())

    def best(self) -> list[Hypothesis]:
        """Highest length-normalized hypothesis of each image (ties: the earliest found)."""
        groups = [tuple(x.cpu() if isinstance(x, Tensor) else x for x in g) for g in self.groups]
        images = torch.cat([g[0] for g in groups])
        log_probs = torch.cat([g[4] for g in groups])
        scored = torch.cat([torch.full_like(g[4], max(g[5], 1)) for g in groups])
        normalized = log_probs / scored.pow(self.length_normalization)
        group_of = torch.cat([torch.full_like(g[0], k) for k, g in enumerate(groups)])
        index_in_group = torch.cat([torch.arange(g[0].numel()) for g in groups])
        order = torch.argsort(normalized, descending=True, stable=True)
        order = order[torch.argsort(images[order], stable=True)]
        first = torch.ones_like(order, dtype=torch.bool)
        first[1:] = images[order][1:] != images[order][:-1]
        chosen = order[first]
        if not torch.equal(images[chosen], torch.arange(self.counts.numel())):
            raise RuntimeError("beam search ended without a hypothesis for some image")
        hypotheses = []
        for pick in chosen.tolist():
            _, tokens, output_attention, input_attention, group_log_probs, _ = groups[
                int(group_of[pick])
            ]
            row = int(index_in_group[pick])
            hypotheses.append(
                Hypothesis(
                    tokens[row].tolist(),
                    float(group_log_probs[row]),
                    output_attention[row].float(),
                    input_attention[row].float(),
                )
            )
        return hypotheses


@torch.no_grad()
@_checks_read_once
def beam_search(
    decoder: AttentionDecoder,
    features: Tensor,
    *,
    start_id: int,
    end_id: int,
    beam_size: int,
    max_length: int,
    length_normalization: float = DEFAULT_LENGTH_NORMALIZATION,
    block_trigrams: bool = False,
    banned_ids: Sequence[int] = (),
    output_mapping: str = "softmax",
) -> list[Hypothesis]:
    """Batched beam search: all images x beams advance together in one tensor.

    Args:
        decoder: the trained decoder (in eval mode).
        features: ``(B, H, W, C)`` float grid features.
        start_id, end_id: ids of the start and end tokens.
        beam_size: beams per image (1 = greedy search).
        max_length: most words per caption (end token excluded).
        length_normalization: exponent a of the ranking score log_prob / n ** a (finite, >= 0).
        block_trigrams: never repeat a trigram within a hypothesis.
        banned_ids: words never generated.
        output_mapping: ``"softmax"``, ``"sparsemax"`` or ``"entmax15"``, as trained.

    Returns:
        The best :class:`Hypothesis` of each image, in input order.
    """
    _check_arguments(decoder, start_id, end_id, max_length)
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    check_length_normalization(length_normalization)
    vocab_size, beams = decoder.vocab_size, beam_size
    banned = _banned_mask(banned_ids, vocab_size, features.device)
    candidates = min(2 * beams, beams * vocab_size)
    batch, device = features.shape[0], features.device
    if batch == 0:
        return []
    encoded = decoder.encode(features)
    check_search_memory(encoded, batch, beams, vocab_size)
    # Rows are (image, beam) pairs, image-major. Images still being searched are "active";
    # an image that is done leaves the tensors, so later steps only compute active rows.
    active = torch.arange(batch, device=device)
    encoded = encoded.index_select(active.repeat_interleave(beams))
    state = decoder.initial_state(encoded)
    grid = encoded.grid
    beam_offsets = torch.arange(beams, device=device)

    tokens = torch.full((batch * beams,), start_id, dtype=torch.long, device=device)
    # All beams of an image start identical: only the first is live, so that the first step
    # expands distinct words instead of beam_size copies of each.
    beam_scores = torch.full((batch, beams), float("-inf"), device=device)
    beam_scores[:, 0] = 0.0
    history = torch.zeros(batch * beams, 0, dtype=torch.long, device=device)
    output_history = encoded.values.new_zeros(batch * beams, 0, *grid)
    input_history = encoded.values.new_zeros(batch * beams, 0, *grid)
    pool = _FinishedPool(batch, length_normalization, device)
    rank = torch.arange(candidates, device=device)

    for t in range(max_length):
        image_of_row = active.repeat_interleave(beams)
        step = decoder.step(encoded, state, tokens)
        log_probs = word_log_probs(step.scores, output_mapping).masked_fill(banned, float("-inf"))
        if block_trigrams:
            log_probs = log_probs.masked_fill(
                trigram_block_mask(history, vocab_size), float("-inf")
            )
        output_next = torch.cat([output_history, step.output_attention.unsqueeze(1)], dim=1)
        input_next = torch.cat([input_history, step.input_attention.unsqueeze(1)], dim=1)
        flat_scores = beam_scores.view(-1)

        # Log-probs and beam scores are finite or -inf, so "> -inf" tests finiteness in one
        # kernel (torch.isfinite launches four); one nonzero (a host sync) serves the indexing.
        stuck = (flat_scores > -math.inf) & (log_probs.amax(dim=-1) == -math.inf)
        rows = stuck.nonzero().squeeze(1)
        if rows.numel():
            pool.add(image_of_row[rows], history[rows], output_history[rows],
                     input_history[rows], flat_scores[rows], t)

        expanded = (flat_scores.unsqueeze(1) + log_probs).view(active.numel(), -1)
        top_scores, top_index = expanded.topk(candidates, dim=1)
        first_row = (torch.arange(active.numel(), device=device) * beams).unsqueeze(1)
        source_row = first_row + torch.div(top_index, vocab_size, rounding_mode="floor")
        words = top_index % vocab_size
        valid = top_scores > -math.inf
        is_end = words == end_id

        finishing = valid & is_end & (rank < beams)
        image_idx, cand_idx = finishing.nonzero(as_tuple=True)
        if image_idx.numel():
            rows = source_row[image_idx, cand_idx]
            pool.add(active[image_idx], history[rows], output_history[rows],
                     input_history[rows], top_scores[image_idx, cand_idx], t + 1)

        # The best beam_size continuing candidates (fewer when a sparse mapping or trigram
        # blocking leaves fewer finite ones; the missing beams become dead, score -inf).
        continuing = valid & ~is_end
        order = torch.argsort((~continuing).to(torch.int8), dim=1, stable=True)[:, :beams]
        keep = continuing.gather(1, order)
        beam_scores = torch.where(keep, top_scores.gather(1, order), float("-inf"))
        rows = source_row.gather(1, order).view(-1)

        # Images with beam_size finished hypotheses or no live beam leave the search.
        remaining = (pool.counts[active] < beams) & (beam_scores > -math.inf).any(dim=1)
        still_searched = int(remaining.sum())  # the step's last host sync
        if not still_searched:
            return pool.best()
        if still_searched < active.numel():
            kept = remaining.nonzero().squeeze(1)
            kept_rows = (kept.unsqueeze(1) * beams + beam_offsets).view(-1)
            active, beam_scores = active[kept], beam_scores[kept]
            rows = rows[kept_rows]
            order = order[kept]
            words = words[kept]
            encoded = encoded.index_select(kept_rows)
        tokens = words.gather(1, order).view(-1)
        history = torch.cat([history[rows], tokens.unsqueeze(1)], dim=1)
        output_history, input_history = output_next[rows], input_next[rows]
        state = step.state.index_select(rows)

    live = beam_scores.view(-1) > -math.inf
    pool.add(
        active.repeat_interleave(beams)[live],
        history[live],
        output_history[live],
        input_history[live],
        beam_scores.view(-1)[live],
        history.shape[1],
    )
    return pool.best()


def decode_captions(decoder: AttentionDecoder, features: Tensor, options: DecodingOptions,
                    output_mapping: str) -> list[Hypothesis]:
    """Beam-search one caption per image of ``features`` (B, h, w, C) with ``options``, the
    words' distribution given by ``output_mapping``. ``<pad>`` and ``<start>`` are never
    generated, ``<unk>`` only when the options allow it."""
    banned = (Vocabulary.PAD_ID, Vocabulary.START_ID)
    if not options.allow_unk:
        banned += (Vocabulary.UNK_ID,)
    return beam_search(
        decoder,
        features,
        start_id=Vocabulary.START_ID,
        end_id=Vocabulary.END_ID,
        beam_size=options.beam_size,
        max_length=options.max_length,
        length_normalization=options.length_normalization,
        block_trigrams=options.block_trigrams,
        banned_ids=banned,
        output_mapping=output_mapping,
    )
