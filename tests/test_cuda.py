"""CUDA paths: every mapping, the decoder, beam search, inference and a Lightning fit on a GPU
give what the CPU gives. Skipped on machines without CUDA (CI has none)."""

from __future__ import annotations

import copy

import pytest
import torch
from test_decoding import END, MAX_LENGTH, START, ending_decoder
from test_model import random_batch, small_decoder

import captioner.attention as att
from captioner.decoding import beam_search
from captioner.decoding_options import DecodingOptions
from captioner.losses import caption_loss

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# Every registered mapping, with its learnable parameter switched on where it has one, so that
# the gradients of alpha and lam are checked on the device too.
MAPPING_KWARGS = {
    "softmax": {},
    "sparsemax": {},
    "entmax15": {},
    "entmax": {"alpha": 1.3, "learn_alpha": True},
    "fusedmax": {"lam": 0.1},
    "oscarmax": {"lam": 0.1},
    "tvmax": {"lam": 0.1, "learn_lam": True},
}


def test_every_mapping_is_checked():
    assert set(MAPPING_KWARGS) == set(att.MAPPINGS)


def _forward_backward(module, scores, mask, grad, device):
    module = copy.deepcopy(module).to(device)
    z = scores.detach().to(device).requires_grad_()
    out = module(z, mask=mask.to(device))
    out.backward(grad.to(device))
    assert out.device.type == z.grad.device.type == device
    params = {name: p.grad.cpu() for name, p in module.named_parameters()}
    assert all(p.device.type == device for p in module.parameters())
    return out.detach().cpu(), z.grad.cpu(), params


@pytest.mark.parametrize("name", sorted(MAPPING_KWARGS))
def test_mapping_on_cuda_matches_cpu(name):
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(6, 5, 7, generator=generator, dtype=torch.float64)
    mask = torch.rand(6, 5, 7, generator=generator) > 0.2
    mask[:, 0, 0] = True
    grad = torch.randn(6, 5, 7, generator=generator, dtype=torch.float64)
    module = att.build(name, **MAPPING_KWARGS[name]).double()
    cpu = _forward_backward(module, scores, mask, grad, "cpu")
    cuda = _forward_backward(module, scores, mask, grad, "cuda")
    torch.testing.assert_close(cuda, cpu)


@pytest.mark.parametrize("output_attention", ["softmax", "sparsemax", "tvmax"])
def test_training_step_on_cuda_matches_cpu(output_attention):
    decoder = small_decoder("softmax", output_attention).double()
    features, captions = random_batch(batch=4, length=7)
    results = []
    for device in ("cpu", "cuda"):
        model = copy.deepcopy(decoder).to(device)
        output = model(features.double().to(device), captions[:, :-1].to(device))
        loss = caption_loss(output.scores, captions[:, 1:].to(device))
        loss.backward()
        grads = [p.grad.cpu() for p in model.parameters()]
        results.append((loss.detach().cpu(), output.output_attention.detach().cpu(), grads))
    torch.testing.assert_close(results[1], results[0])


@pytest.mark.parametrize("output_attention", ["softmax", "tvmax"])
def test_beam_search_on_cuda_matches_cpu(output_attention):
    decoder = ending_decoder(output_attention=output_attention).double()
    features, _ = random_batch(batch=5, seed=3)
    options = dict(start_id=START, end_id=END, max_length=MAX_LENGTH, beam_size=3)
    cpu = beam_search(decoder, features.double(), **options)
    cuda = beam_search(copy.deepcopy(decoder).cuda(), features.double().cuda(), **options)
    for expected, got in zip(cpu, cuda, strict=True):
        assert got.token_ids == expected.token_ids
        assert got.log_prob == pytest.approx(expected.log_prob, abs=1e-9)
        torch.testing.assert_close(got.output_attention.cpu(), expected.output_attention)


def test_captioner_on_cuda_matches_cpu(tiny_checkpoint, synthetic_data):
    from captioner.inference import Captioner
    from data_prep.karpathy import load_karpathy

    paths = [e.path for e in load_karpathy(synthetic_data.karpathy_json,
                                           synthetic_data.image_root).split("test")]
    options = DecodingOptions(beam_size=2, max_length=8)
    cpu = Captioner.load(tiny_checkpoint).caption(paths, options)
    cuda = Captioner.load(tiny_checkpoint, map_location="cuda").caption(
        paths, options
    )
    assert [c.text for c in cuda] == [c.text for c in cpu]
    for expected, got in zip(cpu, cuda, strict=True):
        assert got.attention.device.type == "cpu"
        # float32 convolutions differ between cuDNN and the CPU (3e-4 seen on an H200).
        torch.testing.assert_close(got.attention, expected.attention, atol=2e-3, rtol=0)


@pytest.mark.parametrize("output_attention", ["softmax", "tvmax"])
def test_lightning_fit_on_gpu(synthetic_data, tiny_fit, tmp_path, output_attention):
    trainer, model, _ = tiny_fit(
        synthetic_data, tmp_path, accelerator="gpu", output_attention=output_attention
    )
    # Lightning moves the module back to the CPU when fit ends.
    assert trainer.strategy.root_device.type == "cuda"
    assert trainer.global_step == 4
    metrics = trainer.callback_metrics
    assert torch.isfinite(metrics["train/loss"]) and "val/CIDEr" in metrics


def test_caption_command_on_cuda_matches_cpu(tiny_checkpoint, synthetic_data, capsys):
    from captioner.commands import caption as command

    images = str(synthetic_data.image_root)
    lines = {}
    for device in ("cpu", "cuda"):
        assert command.main([images, "--ckpt", str(tiny_checkpoint), "--device", device,
                             "--beam-size", "2", "--max-length", "8", "--no-progress"]) == 0
        lines[device] = capsys.readouterr().out.splitlines()
    assert lines["cuda"] == lines["cpu"] and lines["cpu"]
