"""``captioner bench attention|model|fit``: every bad option (a device the machine lacks, a
value out of range, an unknown mapping, an output path that cannot be written) is refused on
one line with status 2 before any work starts, and ``--help`` says every default once."""

from __future__ import annotations

import argparse
import os
from types import SimpleNamespace

import pytest
import torch

from captioner.benchmarks import attention, fit
from captioner.benchmarks import model as bench_model
from captioner.commands import bench

REFUSED = [
    (attention, ["--device", "cuda:99"], "argument --device: device 'cuda:99': "),
    (attention, ["--device", "tpu"], "argument --device: unknown device 'tpu'"),
    (attention, ["--repeats", "0"], "argument --repeats: must be >= 1, got 0"),
    (attention, ["--threads", "0"], "argument --threads: must be >= 1, got 0"),
    # numba's pool has as many threads as the machine's CPUs: more would stop in numba.
    (attention, ["--threads", "100000"], "argument --threads: must be <= "),
    (attention, ["--repeats", "1.5"], "--repeats: invalid value 1.5 (expected int)"),
    (bench_model, ["--device", "cuda:99"], "argument --device: device 'cuda:99': "),
    (bench_model, ["--device", "tpu"], "argument --device: unknown device 'tpu'"),
    (bench_model, ["--warmup", "-1"], "argument --warmup: must be >= 0, got -1"),
    (bench_model, ["--threads", "0"], "argument --threads: must be >= 1, got 0"),
    (bench_model, ["--threads", "100000"], "argument --threads: must be <= "),
    (bench_model, ["--batch-size", "0"], "argument --batch-size: must be >= 1, got 0"),
    # The 4 special tokens and no word to sample captions from.
    (bench_model, ["--vocab-size", "4"], "argument --vocab-size: must be >= 5, got 4"),
    (bench_model, ["--lam", "-1"], "argument --lam: must be a finite number >= 0, got -1"),
    (bench_model, ["--mappings", ""], "argument --mappings: '' names no mapping"),
    (bench_model, ["--mappings", "softmax,,tvmax"],
     "argument --mappings: 'softmax,,tvmax' holds an empty mapping name (a stray comma)"),
    (bench_model, ["--mappings", "softmax,nope"],
     "argument --mappings: unknown attention mapping 'nope'; valid names: softmax,"),
    (bench_model, ["--input-attention", "nope"], "argument --input-attention: invalid choice"),
    (bench_model, ["--json", "{tmp}"], "--json {tmp}: is a folder, expected a file name"),
    (bench_model, ["--json", "/proc/x.json"], "--json /proc/x.json: cannot write to the folder"),
    (fit, ["--accelerator", "tpu"], "argument --accelerator: 'tpu': captioner runs on the CPU"),
    (fit, ["--num-workers", "-1"], "argument --num-workers: must be >= 0, got -1"),
    (fit, ["--precision", "bogus"], "argument --precision: invalid choice: 'bogus'"),
    (fit, ["--batch-size", "0"], "argument --batch-size: must be >= 1, got 0"),
    (fit, ["--warmup-steps", "5", "--steps", "5"],
     "--warmup-steps 5 leaves no step of --steps 5 to time"),
    (fit, ["--images", "10", "--batch-size", "64"],
     "--images 10 give 50 training captions, one batch of --batch-size 64; timing the loader "
     "needs two: give --images 13 or more"),
    (fit, ["--images", "1", "--batch-size", "5"],
     "--images 1 give 5 training captions, one batch of --batch-size 5; "),
    (fit, ["--mappings", ""], "argument --mappings: '' names no mapping"),
    (bench_model, ["--tvmax-overlap", "--mappings", "softmax"], "--tvmax-overlap times TVmax a "
     "second way: give --mappings with tvmax"),
    (bench_model, ["--mappings", "softmax,tvmax,softmax"],
     "argument --mappings: 'softmax,tvmax,softmax' names mapping 'softmax' twice"),
    (fit, ["--mappings", "softmax,nope"], "argument --mappings: no config "),
    (fit, ["--data", "/proc/nope"], "--data /proc/nope: cannot write to the folder /proc"),
    (fit, ["--data", "{tmp}/file"], "--data {tmp}/file: exists and is not a folder"),
    # torch's generators take a C long long: a larger seed ended in a traceback.
    *((module, ["--seed", str(2**64)], f"argument --seed: must be between 0 and {2**63 - 1}, "
       f"got {2**64}") for module in (attention, bench_model, fit)),
    (attention, ["--seed", "-1"], f"argument --seed: must be between 0 and {2**63 - 1}, got -1"),
]
if not torch.cuda.is_available():
    REFUSED += [
        (attention, ["--device", "cuda"], "argument --device: device 'cuda': CUDA is not "
         "available on this machine"),
        (bench_model, ["--device", "cuda:1"], "argument --device: device 'cuda:1': CUDA is not "
         "available on this machine"),
        (fit, ["--accelerator", "gpu"], "argument --accelerator: 'gpu': device 'cuda': CUDA is "
         "not available on this machine"),
    ]

# What each benchmark does first once its options are accepted.
_WORK = {attention: "_mappings", bench_model: "_run_all", fit: "write_coco_shaped"}


@pytest.mark.parametrize(("module", "argv", "message"), REFUSED,
                         ids=[f"{m.__name__.split('.')[-1]} {' '.join(a)}" for m, a, _ in REFUSED])
def test_a_bad_option_is_one_line_with_status_2_before_any_work(module, argv, message,
                                                                 tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("")

    def work(*args, **kwargs):
        raise AssertionError("the benchmark started before its options were checked")

    monkeypatch.setattr(module, _WORK[module], work)
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in argv]
    with pytest.raises(SystemExit) as exited:
        bench.main([_name(module), *argv])
    captured = capsys.readouterr()
    assert exited.value.code == 2 and captured.out == ""
    prog = f"captioner bench {_name(module)}: error: "
    assert captured.err.startswith(prog + message.replace("{tmp}", str(tmp_path)))
    assert captured.err.count("\n") == 1


def _name(module) -> str:
    return module.__name__.split(".")[-1]


@pytest.mark.parametrize("module", [attention, bench_model, fit])
def test_help_says_each_default_once(module):
    parser = bench.build_parser(_name(module))
    formatter = parser._get_formatter()
    for action in parser._actions:
        if action.default in (None, False, argparse.SUPPRESS):
            continue
        text = " ".join(formatter._expand_help(action).split())
        assert text.count("default:") == 1, (action.option_strings, text)
        assert f"default: {action.default})" in text, (action.option_strings, text)


def test_the_fit_lowers_the_configs_workers_to_the_usable_cpus(monkeypatch):
    """More workers than CPUs only contend for them (and torch warns at length)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})

    def datamodule(workers, config=None):
        return SimpleNamespace(hparams=SimpleNamespace(num_workers=config), loader_workers=workers)

    two = datamodule(2)  # the DataModule's default (4 at most the usable CPUs), the config null
    assert fit._loader_workers(two, None) == "2 (the default)"
    assert two.hparams.num_workers is None
    eight = datamodule(8, config=8)
    assert fit._loader_workers(eight, None) == "2 (the config's 8, capped at the usable CPUs)"
    assert eight.hparams.num_workers == 2
    none = datamodule(0)  # the default with device-held features
    assert fit._loader_workers(none, None) == "0 (the default)"
    assert none.hparams.num_workers is None
    one = datamodule(1, config=1)
    assert fit._loader_workers(one, None) == "1 (the config's)"
    assert one.hparams.num_workers == 1
    given = datamodule(4)  # --num-workers 3 is in the fit's own arguments already
    assert fit._loader_workers(given, 3) == "3" and given.hparams.num_workers is None



@pytest.mark.parametrize("batch_size", [1, 5, 64])
def test_the_fewest_images_bench_fit_takes_fill_two_loader_batches(batch_size, tmp_path):
    """The option check's bound is the fit loader's own count: at ``min_images`` the training
    captions fill two batches or more, one image fewer (when there is one) a single batch."""
    from captioner.training.datamodule import CaptionDataModule

    def loader_batches(images: int) -> int:
        karpathy, cache = fit.write_coco_shaped(tmp_path / str(images), images=images, grid=1,
                                                channels=4, vocab_size=20, seed=0)
        data = CaptionDataModule(karpathy, karpathy.parent, cache, min_count=1,
                                 batch_size=batch_size, num_workers=0, pin_memory=False)
        data.setup("fit")
        return len(data.train_dataloader())

    fewest = fit.min_images(batch_size)
    assert loader_batches(fewest) >= 2
    assert fewest == 1 or loader_batches(fewest - 1) == 1


def test_the_smallest_accepted_images_reach_the_benchmark(monkeypatch):
    def work(*args, **kwargs):
        raise RuntimeError("started")

    monkeypatch.setattr(fit, "write_coco_shaped", work)
    with pytest.raises(RuntimeError, match="started"):
        bench.main(["fit", "--images", "13", "--batch-size", "64"])
