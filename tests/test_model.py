"""Decoder, additive attention and CaptionModel: shapes, attention weights, teacher forcing."""

from __future__ import annotations

import pytest
import torch

from captioner.model.additive_attention import AdditiveAttention
from captioner.model.caption_model import CaptionModel
from captioner.model.decoder import AttentionDecoder, DecoderOutput
from captioner.model.encoder import build_encoder
from captioner.model.losses import caption_loss

VOCAB, CHANNELS, GRID = 30, 24, (3, 4)

ATTENTION_PAIRS = [
    ("softmax", "softmax"),
    ("softmax", "sparsemax"),
    ("sparsemax", "entmax15"),
    ("softmax", "tvmax"),
]


def small_decoder(
    input_attention="softmax", output_attention="softmax", channels=CHANNELS, **kwargs
):
    torch.manual_seed(0)
    settings = dict(feature_dim=16, embed_dim=8, hidden_dim=16, attention_dim=12, dropout=0.0)
    settings.update(kwargs)
    return AttentionDecoder(
        VOCAB,
        channels,
        input_attention=input_attention,
        output_attention=output_attention,
        **settings,
    )


def random_batch(batch=3, length=6, seed=1):
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(batch, *GRID, CHANNELS, generator=generator)
    captions = torch.randint(3, VOCAB, (batch, length), generator=generator)
    captions[:, 0] = 1
    return features, captions


class GridSoftmax(torch.nn.Module):
    """Softmax over a flattened grid, written here so the test does not rely on the registry."""

    def forward(self, scores, mask=None):
        return torch.softmax(scores.flatten(-2), -1).view_as(scores)


def test_additive_attention_matches_concatenated_affine_form():
    # Paper Sec. 3: z_i = w^T tanh(W [v_i; h] + b), computed here with an explicit
    # concatenation and the two halves of W put side by side.
    torch.manual_seed(0)
    module = AdditiveAttention(5, 7, 4, GridSoftmax())
    values, query = torch.randn(2, 6, 5), torch.randn(2, 7)
    context, weights = module(module.keys(values), values, query, (2, 3))

    weight = torch.cat([module.key_projection.weight, module.query_projection.weight], dim=1)
    joint = torch.cat([values, query.unsqueeze(1).expand(2, 6, 7)], dim=-1)
    scores = torch.tanh(joint @ weight.T + module.key_projection.bias) @ module.score.weight[0]
    expected = torch.softmax(scores, dim=-1)
    torch.testing.assert_close(weights, expected.view(2, 2, 3))
    torch.testing.assert_close(context, torch.einsum("bk,bkg->bg", expected, values))


@pytest.mark.parametrize(("input_attention", "output_attention"), ATTENTION_PAIRS)
def test_decoder_shapes_and_attention_weights(input_attention, output_attention):
    decoder = small_decoder(input_attention, output_attention)
    features, captions = random_batch()
    output = decoder(features, captions)
    assert isinstance(output, DecoderOutput)
    assert output.scores.shape == (3, 6, VOCAB)
    for maps in (output.output_attention, output.input_attention):
        assert maps.shape == (3, 6, *GRID)
        assert (maps >= 0).all()
        torch.testing.assert_close(maps.sum(dim=(-2, -1)), torch.ones(3, 6))
    assert decoder.input_attention.mapping.is_sparse == (input_attention != "softmax")
    assert decoder.output_attention.mapping.is_sparse == (output_attention != "softmax")


def test_sparse_attention_gives_exact_zeros_and_softmax_none():
    decoder = small_decoder("softmax", "sparsemax")
    # Large features make the scores spread widely, so sparsemax leaves cells out.
    features, captions = random_batch(batch=4)
    output = decoder(features * 20, captions)
    assert (output.output_attention == 0).any()
    assert (output.input_attention > 0).all()


def test_step_by_step_equals_teacher_forcing():
    decoder = small_decoder("softmax", "sparsemax").eval()
    features, captions = random_batch()
    output = decoder(features, captions)
    encoded = decoder.encode(features)
    state = decoder.initial_state(encoded)
    for t in range(captions.shape[1]):
        step = decoder.step(encoded, state, captions[:, t])
        state = step.state
        torch.testing.assert_close(step.scores, output.scores[:, t])
        torch.testing.assert_close(step.output_attention, output.output_attention[:, t])
        torch.testing.assert_close(step.input_attention, output.input_attention[:, t])


def reference_pass(decoder, features, captions):
    """The decoder's teacher-forced pass written from the paper's equations (Sec. 3) with
    torch's own modules: nn.LSTMCell on [s_t; E y_{t-1}], each attention through its forward
    pass, one step at a time. Returns scores, output and input attention."""
    values = decoder.feature_projection(features.flatten(1, 2))
    mean = values.mean(1)
    hidden, cell = torch.tanh(decoder.init_hidden(mean)), torch.tanh(decoder.init_cell(mean))
    grid = features.shape[1:3]
    in_keys, out_keys = (attend.key_projection(values) for attend in
                         (decoder.input_attention, decoder.output_attention))
    scores, out_maps, in_maps = [], [], []
    for t in range(captions.shape[1]):
        context, in_map = decoder.input_attention(in_keys, values, hidden, grid)
        lstm_input = torch.cat([context, decoder.embedding(captions[:, t])], -1)
        hidden, cell = decoder.lstm(lstm_input, (hidden, cell))
        visual, out_map = decoder.output_attention(out_keys, values, hidden, grid)
        visual = torch.tanh(decoder.context_projection(visual))
        scores.append(decoder.word_scores(torch.cat([visual, hidden], -1)))
        out_maps.append(out_map)
        in_maps.append(in_map)
    return tuple(torch.stack(x, 1) for x in (scores, out_maps, in_maps))


@pytest.mark.parametrize("output_attention", ["softmax", "tvmax"])
def test_decoder_pass_and_gradients_match_the_equations_with_torch_lstm_cell(output_attention):
    # The recurrence multiplies the LSTM's weights itself (h_{t-1} with W_hh and the input
    # attention's W_h in one product, the words' share of the gates for all steps at once):
    # it must give nn.LSTMCell's pass and gradients, to float64 rounding.
    decoder = small_decoder("softmax", output_attention).double()
    features, captions = random_batch(length=7)
    assert_pass_matches_reference(decoder, features.double(), captions,
                                  {"rtol": 1e-12, "atol": 1e-12}, {"rtol": 1e-10, "atol": 1e-12})


def assert_pass_matches_reference(decoder, features, captions, tolerance: dict,
                                  grad_tolerance: dict) -> None:
    """The decoder's pass equals :func:`reference_pass` within ``tolerance``, and the
    gradients of every parameter (of a random weighting of the scores) within
    ``grad_tolerance``."""
    output = decoder(features, captions)
    expected = reference_pass(decoder, features, captions)
    for got, want in zip(output, expected, strict=True):
        torch.testing.assert_close(got, want, **tolerance)
    weights = torch.randn_like(output.scores)
    grads = torch.autograd.grad((output.scores * weights).sum(), list(decoder.parameters()))
    want = torch.autograd.grad((expected[0] * weights).sum(), list(decoder.parameters()))
    for (name, _), got_grad, want_grad in zip(decoder.named_parameters(), grads, want,
                                               strict=True):
        torch.testing.assert_close(got_grad, want_grad, **grad_tolerance, msg=name)


def test_decoder_rejects_bad_shapes_and_names():
    decoder = small_decoder()
    features, captions = random_batch()
    with pytest.raises(ValueError, match=r"grid features \(B, H, W, 24\)"):
        decoder(features[..., :5], captions)
    with pytest.raises(ValueError, match="captions"):
        decoder(features, captions[0])
    with pytest.raises(ValueError, match="torch.long"):
        decoder(features, captions.float())
    with pytest.raises(ValueError, match="unknown attention mapping 'nope'"):
        small_decoder(output_attention="nope")
    with pytest.raises(ValueError, match="dropout"):
        small_decoder(dropout=1.5)


@pytest.mark.parametrize(
    ("input_attention", "output_attention", "output_mapping"),
    [
        ("softmax", "softmax", "softmax"),
        ("softmax", "sparsemax", "sparsemax"),
        ("sparsemax", "entmax15", "entmax15"),
        ("softmax", "tvmax", "softmax"),
    ],
)
def test_teacher_forced_loss_decreases(input_attention, output_attention, output_mapping):
    decoder = small_decoder(input_attention, output_attention)
    features, captions = random_batch(batch=4, length=7)
    captions[2:, 5:] = 0  # padded captions
    optimizer = torch.optim.Adam(decoder.parameters(), lr=1e-2)
    losses = []
    for _ in range(40):
        output = decoder(features, captions[:, :-1])
        loss = caption_loss(output.scores, captions[:, 1:], output_mapping=output_mapping)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.25 * losses[0], losses


def test_caption_model_accepts_images_and_cached_features():
    encoder = build_encoder("resnet18", weights=None)
    decoder = small_decoder(channels=encoder.channels)
    model = CaptionModel(encoder, decoder).eval()
    images = torch.randn(2, 3, 96, 128)
    captions = torch.randint(3, VOCAB, (2, 4))
    from_images = model(images, captions)
    assert from_images.output_attention.shape == (2, 4, 3, 4)

    cached = encoder(images).half()
    from_cache = model(cached, captions)
    assert from_cache.scores.dtype == torch.float32
    torch.testing.assert_close(
        from_cache.output_attention, from_images.output_attention, atol=2e-3, rtol=0
    )
    with pytest.raises(ValueError, match=r"images \(B, 3, H, W\) or cached features"):
        model(torch.randn(2, 4, 4, 7), captions)
    with pytest.raises(ValueError, match="without an encoder"):
        CaptionModel(None, decoder)(images, captions)
    with pytest.raises(ValueError, match="512 channels"):
        CaptionModel(encoder, small_decoder())


@pytest.mark.parametrize("output_attention", ["softmax", "sparsemax", "entmax15", "tvmax"])
def test_bf16_autocast_keeps_the_mappings_in_float32(output_attention):
    decoder = small_decoder("softmax", output_attention)
    features, captions = random_batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        output = decoder(features, captions[:, :-1])
        loss = caption_loss(output.scores, captions[:, 1:])
    loss.backward()
    assert output.scores.dtype == torch.bfloat16
    for weights in (output.output_attention, output.input_attention):
        assert weights.dtype == torch.float32
        torch.testing.assert_close(weights.sum((-2, -1)), torch.ones(weights.shape[:2]))
    assert all(torch.isfinite(p.grad).all() for p in decoder.parameters() if p.grad is not None)
    # The recurrence's weights are cast to bfloat16 once a pass, and the pass stays the
    # float32 pass to bfloat16's precision.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert decoder.encode(features).recurrence.hidden.dtype == torch.bfloat16
    with torch.no_grad():
        full = decoder(features, captions[:, :-1])
    torch.testing.assert_close(output.scores.float(), full.scores, atol=0.05, rtol=0.05)
    torch.testing.assert_close(output.input_attention, full.input_attention, atol=0.02, rtol=0)


@pytest.mark.parametrize("length", [3, 4, 9])  # fewer words than a group, a group, groups and one
@pytest.mark.parametrize("input_attention", ["softmax", "tvmax"])
def test_output_attention_solved_in_the_background_gives_the_same_pass(
    monkeypatch, length, input_attention
):
    """With TVmax's background solves the output attention starts on every OVERLAP_WORDS words
    during the loop: the same outputs and gradients up to the order of the sums (a group's
    matrix products may take other kernels than the whole sequence's; float64 here), also
    with the input attention solved on the host in between."""
    import sys

    from captioner.model import decoder as decoder_module

    tvmax_module = sys.modules["captioner.attention.tvmax"]
    decoder = small_decoder(input_attention, "tvmax", output_attention_kwargs={"lam": 0.05},
                            input_attention_kwargs={"lam": 0.05} if input_attention == "tvmax"
                            else None).double()
    features, captions = random_batch(length=length)
    features = features.double()
    started = []
    start = type(decoder.output_attention).start
    monkeypatch.setattr(type(decoder.output_attention), "start",
                        lambda self, *args: started.append(1) or start(self, *args))
    passes = []
    for overlap in (False, True):
        monkeypatch.setattr(tvmax_module, "OVERLAP_OVERRIDE", overlap)
        decoder.zero_grad()
        output = decoder(features, captions)
        (output.scores.square().sum() + output.output_attention.square().sum()).backward()
        passes.append((output, {name: p.grad.clone() for name, p in decoder.named_parameters()}))
    assert len(started) == -(-length // decoder_module.OVERLAP_WORDS)
    (plain, plain_grads), (overlapped, overlapped_grads) = passes
    for name in ("scores", "output_attention", "input_attention"):
        torch.testing.assert_close(getattr(overlapped, name), getattr(plain, name),
                                   rtol=1e-12, atol=1e-14)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(overlapped_grads[name], grad, rtol=1e-12, atol=1e-14)
