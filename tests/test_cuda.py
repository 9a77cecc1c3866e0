"""CUDA paths: every mapping, the decoder, beam search, inference and a Lightning fit on a GPU
give what the CPU gives. Skipped on machines without CUDA (CI has none)."""

from __future__ import annotations

import copy

import pytest
import torch
from test_decoding import END, MAX_LENGTH, START, ending_decoder
from test_model import assert_pass_matches_reference, random_batch, small_decoder

import captioner.attention as att
from captioner.model.decoding import beam_search
from captioner.model.decoding_options import DecodingOptions
from captioner.model.losses import caption_loss
from captioner.training.optimizer import adam

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


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_decoder_on_cuda_matches_the_equations_with_torch_lstm_cell(dtype):
    # On a GPU the recurrence runs torch's fused LSTM cell on gates it multiplied itself.
    decoder = small_decoder("softmax", "sparsemax").to("cuda", dtype)
    features, captions = random_batch(length=7)
    tolerance = {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {}
    assert_pass_matches_reference(decoder, features.to("cuda", dtype), captions.cuda(),
                                  tolerance, tolerance)


def test_adam_is_fused_on_the_gpu_and_steps_as_the_single_tensor_adam():
    generator = torch.Generator().manual_seed(0)
    start = [torch.randn(5, 3, generator=generator), torch.randn(3, generator=generator)]
    fused_params = [p.cuda().requires_grad_() for p in start]
    plain_params = [p.cuda().requires_grad_() for p in start]
    fused = adam(fused_params, lr=1e-2, betas=(0.8, 0.999))
    plain = torch.optim.Adam(plain_params, lr=1e-2, betas=(0.8, 0.999), foreach=False)
    on_cpu = adam([p.clone().requires_grad_() for p in start], lr=1e-2, betas=(0.8, 0.999))
    assert fused.defaults["fused"] and on_cpu.defaults["fused"] is None
    for _ in range(4):
        for p, q in zip(fused_params, plain_params, strict=True):
            p.grad = torch.randn(p.shape, generator=generator).cuda()
            q.grad = p.grad.clone()
        fused.step()
        plain.step()
    torch.testing.assert_close(fused_params, plain_params)


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


def test_beam_search_reads_the_device_at_most_three_times_a_step():
    """Which beams are stuck, which finish, how many images are still searched: one host read
    each per word (the attention checks are read once, at the end). The end token is banned,
    so that every search runs ``max_length`` words, and the difference of two lengths leaves
    out what a search reads once."""
    import warnings

    decoder = small_decoder().eval().cuda()
    features = random_batch(batch=4)[0].cuda()

    def reads(max_length: int) -> int:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                beam_search(decoder, features, start_id=START, end_id=END, beam_size=3,
                            max_length=max_length, banned_ids=(END,))
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return sum("synchroniz" in str(warning.message) for warning in caught)

    reads(4)  # CUDA's lazy start-up is not the search's
    assert 0 < reads(8) - reads(4) <= 3 * 4


def test_captioner_on_cuda_matches_cpu(tiny_checkpoint, synthetic_data):
    from captioner.inference.pipeline import Captioner
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


@pytest.fixture(scope="module")
def tiny_cache(synthetic_data, tmp_path_factory):
    """Features of the tiny dataset by the tiny model's encoder (random ResNet-18, layer4)."""
    from conftest import TINY_IMAGE_SIZE

    from captioner.features.extraction import extract_features

    out = tmp_path_factory.mktemp("features") / "features_resnet18.h5"
    extract_features(synthetic_data.karpathy_json, synthetic_data.image_root, out,
                     arch="resnet18", weights=None, image_size=TINY_IMAGE_SIZE, batch_size=8,
                     num_workers=0, progress=False)
    return out


def test_features_held_on_the_gpu_are_gathered_there(synthetic_data, tiny_cache):
    from captioner.training.datamodule import DeviceFeatures
    from data_prep.features import FeatureCache
    from data_prep.karpathy import load_karpathy

    entries = load_karpathy(synthetic_data.karpathy_json, synthetic_data.image_root).split("train")
    held = DeviceFeatures(tiny_cache)
    held.preload(entries)
    picked = entries[::-3]
    got = held.gather(held.many(picked).cuda())
    assert got.device.type == "cuda" and got.dtype == torch.float16
    expected = FeatureCache(tiny_cache).get_many([entry.image_id for entry in picked])
    assert torch.equal(got.cpu(), torch.from_numpy(expected))


def test_lightning_fit_on_gpu_with_the_features_held_there(synthetic_data, tiny_fit, tiny_cache,
                                                           tmp_path):
    from data_prep.features import FeatureCache

    trainer, _, data = tiny_fit(synthetic_data, tmp_path, accelerator="gpu",
                                feature_cache=tiny_cache, preload_features="device",
                                encoder_weights=FeatureCache(tiny_cache).encoder["weights"])
    assert trainer.strategy.root_device.type == "cuda" and trainer.global_step == 4
    assert data.hparams.preload_features == "device"
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("length", [64, 256, 10000, 20000])
def test_sparsemax_on_cuda_matches_cpu(length, dtype):
    """Rows up to FUSED_MAX_LENGTH take the fused Triton kernels, longer ones the sort path."""
    import importlib

    module = importlib.import_module("captioner.attention.sparsemax")
    generator = torch.Generator().manual_seed(length)
    z = torch.randn(32, length, generator=generator, dtype=dtype) * 0.1
    grad = torch.randn(32, length, generator=generator, dtype=dtype)
    assert module._use_fused_kernels(z.cuda(), -1) == (length <= module.FUSED_MAX_LENGTH)
    results = []
    for device in ("cpu", "cuda"):
        zz = z.clone().to(device).requires_grad_()
        p = att.sparsemax(zz)
        p.backward(grad.to(device))
        results.append((p.detach().cpu(), zz.grad.cpu()))
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(results[1][0], results[0][0], atol=tol, rtol=0)
    torch.testing.assert_close(results[1][1], results[0][1], atol=10 * tol, rtol=0)
    assert torch.equal(results[1][0] > 0, results[0][0] > 0)


def _tvmax_module():
    import sys

    return sys.modules["captioner.attention.tvmax"]


@pytest.fixture
def device_solver(monkeypatch):
    """TVmax's forward pass on the GPU (certified Dykstra) for the test."""
    monkeypatch.setattr(_tvmax_module(), "SOLVER_OVERRIDE", "device")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(512, 8, 8), (128, 16, 16), (64, 5, 7)])
@pytest.mark.parametrize("lam", [0.01, 0.1])
def test_tvmax_device_solver_matches_the_cpu_solver(shape, lam, dtype, device_solver):
    module = _tvmax_module()
    generator = torch.Generator().manual_seed(0)
    z = torch.randn(*shape, generator=generator, dtype=dtype)
    grad = torch.randn(*shape, generator=generator, dtype=dtype)
    results = []
    for device in ("cpu", "cuda"):
        zz = z.clone().to(device).requires_grad_()  # a leaf of its own on each device
        lam_t = torch.tensor(lam, dtype=dtype, device=device, requires_grad=True)
        before = dict(module.DEVICE_STATS)
        out = att.tvmax(zz, lam_t)
        out.backward(grad.to(device))
        results.append((out.detach().cpu(), zz.grad.cpu(), lam_t.grad.cpu()))
    # Exact whatever share of grids the certificate leaves to the CPU (a speed matter, which
    # captioner bench attention --device cuda reports).
    assert module.DEVICE_STATS["grids"] - before["grids"] == shape[0]
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(results[1][0], results[0][0], atol=tol, rtol=0)
    torch.testing.assert_close(results[1][1], results[0][1], atol=10 * tol, rtol=0)
    torch.testing.assert_close(results[1][2], results[0][2], atol=1e-4, rtol=1e-5)


def test_tvmax_device_groups_hold_bitwise_equal_weights():
    from captioner.attention._tv2d_dykstra import tvmax_rows_dykstra

    z = torch.randn(256, 64, device="cuda")
    weights, group, _, status, _ = tvmax_rows_dykstra(z, 0.1, 8, 8)
    done = status == 0
    weights, group = weights[done], group[done].long()
    lowest = torch.full_like(weights, float("inf")).scatter_reduce(1, group, weights, "amin")
    highest = torch.full_like(weights, -float("inf")).scatter_reduce(1, group, weights, "amax")
    assert torch.equal(lowest.gather(1, group), highest.gather(1, group))
    assert bool((group.gather(1, group) == group).all())  # labels are the groups' first cells


def _syncs(run) -> int:
    """How many synchronizing CUDA operations ``run()`` makes."""
    import warnings

    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


@pytest.mark.parametrize("solver", ["host", "device"])
def test_tvmax_syncs_once_per_call(solver, monkeypatch):
    monkeypatch.setattr(_tvmax_module(), "SOLVER_OVERRIDE", solver)
    z = torch.randn(64, 8, 8, device="cuda", requires_grad=True)
    grad = torch.randn(64, 8, 8, device="cuda")
    att.tvmax(z, 0.01).backward(grad)  # compile and warm up
    # The one sync: the copy of the scores to the host (host solver), or reading which grids
    # the certificate left to the CPU (device solver). None for the copy of the results back
    # (page-locked), none in the backward pass.
    assert _syncs(lambda: att.tvmax(z, 0.01).backward(grad)) == 1


@pytest.mark.parametrize("shape", [(64, 8, 8), (4, 32, 32), (2, 33, 33)])
def test_tvmax_backward_on_cuda_matches_cpu(shape):
    """The one-kernel backward (grids up to 32 x 32) and the PyTorch path (larger grids)."""
    generator = torch.Generator().manual_seed(0)
    z = torch.randn(*shape, generator=generator, dtype=torch.float64)
    grad = torch.randn(*shape, generator=generator, dtype=torch.float64)
    results = []
    for device in ("cpu", "cuda"):
        zz = z.clone().to(device).requires_grad_()
        lam = torch.tensor(0.1, dtype=torch.float64, device=device, requires_grad=True)
        att.tvmax(zz, lam).backward(grad.to(device))
        results.append((zz.grad.cpu(), lam.grad.cpu()))
    torch.testing.assert_close(results[1], results[0], atol=1e-12, rtol=1e-9)


def test_tvmax_backward_on_cuda_never_syncs():
    z = torch.randn(64, 8, 8, device="cuda", requires_grad=True)
    grad = torch.randn(64, 8, 8, device="cuda")
    weights = att.tvmax(z, 0.1)  # the host solver: the forward pass makes the round trip
    assert _syncs(lambda: weights.backward(grad)) == 0


@pytest.mark.parametrize("output_attention", ["softmax", "sparsemax", "entmax15", "tvmax"])
def test_bf16_autocast_training_step(output_attention):
    decoder = small_decoder("softmax", output_attention).cuda()
    features, captions = random_batch(batch=4, length=7)
    features, captions = features.cuda(), captions.cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        output = decoder(features, captions[:, :-1])
        loss = caption_loss(output.scores, captions[:, 1:])
    loss.backward()
    assert torch.isfinite(loss)
    assert output.output_attention.dtype == torch.float32
    sums = output.output_attention.sum((-2, -1))
    torch.testing.assert_close(sums, torch.ones_like(sums))
    assert all(torch.isfinite(p.grad).all() for p in decoder.parameters() if p.grad is not None)


def test_training_step_checks_do_not_sync_per_call():
    """The attention and loss checks of a step are read back once (DeferredChecks)."""
    decoder = small_decoder("softmax", "sparsemax").cuda()
    features, captions = random_batch(batch=4, length=7)
    features, captions = features.cuda(), captions.cuda()
    checks = att.DeferredChecks()

    def step():
        with checks:
            output = decoder(features, captions[:, :-1])
            caption_loss(output.scores, captions[:, 1:]).backward()

    step()  # warm up
    checks.raise_first()
    assert _syncs(step) == 0
    assert _syncs(checks.raise_first) == 1


def test_tvmax_background_solves_keep_the_training_pass_and_its_thread_unsynced(monkeypatch):
    """CAPTIONER_TVMAX_OVERLAP: the output attention's host solves wait for their copies in
    the background thread, so the training pass's own thread never waits for the device
    (without it, TVmax's copy to the host is one sync), and the pass is the same."""
    decoder = small_decoder("softmax", "tvmax", output_attention_kwargs={"lam": 0.1}).cuda()
    features, captions = random_batch(batch=4, length=10)
    features, captions = features.cuda(), captions.cuda()
    checks = att.DeferredChecks()
    passes = []

    def step():
        decoder.zero_grad()
        with checks:
            output = decoder(features, captions[:, :-1])
            caption_loss(output.scores, captions[:, 1:]).backward()
        passes.append((output.scores.detach(), output.output_attention.detach(),
                       [p.grad.clone() for p in decoder.parameters()]))

    step()  # warm up, without the overlap
    monkeypatch.setattr(_tvmax_module(), "OVERLAP_OVERRIDE", True)
    step()
    checks.raise_first()
    assert _syncs(step) == 0
    torch.testing.assert_close(passes[2], passes[0])
