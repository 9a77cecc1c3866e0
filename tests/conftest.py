"""Shared session fixtures: a tiny synthetic dataset and a real checkpoint trained on it.

Both are built once per test session under pytest's temporary directory. Tests that only read
them may use them freely; tests must not modify the files they point to.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TINY_IMAGE_SIZE = 128  # ResNet grid of 4 x 4 cells: small enough to be quick, still a 2-D map

# Markers of what a test costs beyond its own code (registered in pyproject.toml); each makes it
# slow too, so that `pytest -m "not slow"` leaves all of them out.
COSTLY = ("subprocess", "java", "browser", "ddp", "triton_interpreter", "demo")


def pytest_configure(config) -> None:
    """One intra-op thread for torch and numba in the test process: the tests' tensors are
    tiny, and on the shared 2-core CI machine spinning worker threads made a training step
    of the small model ~30x slower (10 s instead of 0.35 s, measured). The tests' child
    processes inherit one OpenMP thread (torch's), as each pytest-xdist worker is a process that
    already keeps a core busy; numba's count is left to them, for the tests of its parallel
    drivers."""
    import os
    import signal

    import numba
    import torch

    # The tests send Ctrl-C (SIGINT) and check what a command does with it; started as a
    # shell's background job (`pytest &`), this process would have it ignored.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    torch.set_num_threads(1)
    numba.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by the markers
def pytest_collection_modifyitems(config, items) -> None:
    """Mark ``slow`` every test that carries one of the :data:`COSTLY` markers. Under
    pytest-xdist (``-n``), slow tests go first: the workers take tests in this order, and a
    test of a minute left for the end would keep one worker busy while the others idle."""
    for item in items:
        if any(item.get_closest_marker(name) for name in COSTLY):
            item.add_marker(pytest.mark.slow)
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: its order is the schedule's
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


# Modules whose tests share a costly module fixture (a Triton-interpreter child, a demo run):
# each goes to one pytest-xdist worker, so that the fixture is made once. Their xdist_group
# markers say the same, but pytest-xdist 3.8 sets them in a node id attribute that pytest 9
# no longer reads, so the scheduler below groups by these files.
SHARED_FIXTURE_MODULES = frozenset({
    "tests/test_demo.py",
    "tests/test_sparsemax_triton.py",
    "tests/test_tvmax_backward_triton.py",
    "tests/test_tvmax_dykstra.py",
})


def pytest_xdist_make_scheduler(config, log):
    """Under ``--dist loadgroup``: each of :data:`SHARED_FIXTURE_MODULES` is one unit of work,
    every other test one of its own (taken in collection order, the costly first)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureModules(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in SHARED_FIXTURE_MODULES else nodeid

    return SharedFixtureModules(config, log)


@pytest.fixture
def two_numba_threads():
    """Two numba threads for one test (the parallel kernel drivers need more than one)."""
    import numba

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba has a single thread on this machine")
    numba.set_num_threads(2)
    yield
    numba.set_num_threads(1)


@pytest.fixture
def ctrl_c_inside_torch_save(monkeypatch):
    """``arm(n)``: the n-th torch.save from then on gets a SIGINT (Ctrl-C) while its zip
    writer is writing, the moment a real Ctrl-C corrupts: inside, the writer turns the
    KeyboardInterrupt of the Python handler into a RuntimeError. SIGINT's handler is restored
    afterwards (Lightning ignores Ctrl-C while it shuts a run down)."""
    import signal

    import torch

    save, calls = torch.save, []

    class Interrupting:
        def __init__(self, handle, interrupt: bool) -> None:
            self.handle, self.interrupt, self.writes = handle, interrupt, 0

        def write(self, data) -> int:
            self.writes += 1
            if self.interrupt and self.writes == 2:  # with a record written, mid-archive
                signal.raise_signal(signal.SIGINT)
            return self.handle.write(data)

        def flush(self) -> None:
            self.handle.flush()

    def interrupted(checkpoint, handle, *args, **kwargs):
        calls.append(handle)
        save(checkpoint, Interrupting(handle, len(calls) == armed[0]), *args, **kwargs)

    armed = [0]
    handler = signal.getsignal(signal.SIGINT)
    # Python's own Ctrl-C handler, also after a test whose fit left SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    monkeypatch.setattr(torch, "save", interrupted)
    yield lambda n: armed.__setitem__(0, n)
    signal.signal(signal.SIGINT, handler)


@pytest.fixture(scope="session")
def synthetic_data(tmp_path_factory):
    """A tiny :class:`data_prep.synthetic.SyntheticDataset` (16 train, 4 val, 4 test images)."""
    from data_prep.synthetic import generate

    return generate(
        tmp_path_factory.mktemp("synthetic"),
        n_train=16,
        n_val=4,
        n_test=4,
        seed=0,
        image_size=TINY_IMAGE_SIZE,
        progress=False,
    )


@pytest.fixture(scope="session")
def tiny_checkpoint(synthetic_data, tmp_path_factory) -> Path:
    """Path of a Lightning checkpoint of a small TVmax captioner trained for a few steps.

    Encoder: ResNet-18 with random weights (nothing can be downloaded), frozen; output attention
    TVmax; small decoder dimensions. Loadable by
    :meth:`captioner.inference.pipeline.Captioner.load`.
    """
    out = tmp_path_factory.mktemp("tiny_checkpoint")
    return train_tiny(synthetic_data, out, output_attention="tvmax", max_steps=4)


@pytest.fixture(scope="session")
def tiny_fit():
    """The function :func:`fit_tiny`, for tests that train their own small captioner."""
    return fit_tiny


def tiny_model_kwargs(**overrides) -> dict:
    """Init arguments of a small CaptioningModule (random ResNet-18, small decoder)."""
    kwargs = dict(
        encoder_arch="resnet18",
        encoder_weights=None,
        encoder_trainable=False,
        image_size=TINY_IMAGE_SIZE,
        feature_dim=32,
        embed_dim=16,
        hidden_dim=32,
        dropout=0.0,
        lr=1e-3,
        decoding={"beam_size": 2, "max_length": 12},
    )
    kwargs.update(overrides)
    return kwargs


def fit_tiny(
    dataset,
    out_dir: Path,
    *,
    max_steps: int = 4,
    feature_cache: Path | None = None,
    preload_features: bool | str = False,
    accelerator: str = "cpu",
    **model_overrides,
):
    """Train a small CaptioningModule for ``max_steps`` steps; returns (trainer, model, data).

    Runs the real DataModule, LightningModule, validation (BLEU-4 / CIDEr on one batch) and
    atomic checkpoint IO, in one process on ``accelerator``.
    """
    import lightning as L

    from captioner.checkpointing import AtomicCheckpointIO
    from captioner.training.datamodule import CaptionDataModule
    from captioner.training.module import CaptioningModule

    L.seed_everything(0, verbose=False)
    data = CaptionDataModule(
        karpathy_json=dataset.karpathy_json,
        image_root=dataset.image_root,
        feature_cache=feature_cache,
        preload_features=preload_features,
        min_count=1,
        image_size=TINY_IMAGE_SIZE,
        batch_size=8,
        eval_batch_size=4,
        num_workers=0,
    )
    model = CaptioningModule(vocab_size=data.vocab_size, **tiny_model_kwargs(**model_overrides))
    trainer = L.Trainer(
        accelerator=accelerator,
        devices=1,
        max_steps=max_steps,
        limit_train_batches=max_steps,  # one epoch, so that validation runs at its end
        limit_val_batches=1,
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
        plugins=[AtomicCheckpointIO()],
        default_root_dir=out_dir,
    )
    trainer.fit(model, datamodule=data)
    return trainer, model, data


def train_tiny(dataset, out_dir: Path, **kwargs) -> Path:
    """:func:`fit_tiny`, then save the checkpoint as ``out_dir/tiny.ckpt`` and return its path."""
    trainer, _, _ = fit_tiny(dataset, out_dir, **kwargs)
    path = Path(out_dir) / "tiny.ckpt"
    trainer.save_checkpoint(path, weights_only=False)
    return path


@pytest.fixture(scope="session")
def cache32(synthetic_data, tmp_path_factory) -> Path:
    """A feature cache of the tiny dataset at 32 px by a random ResNet-18 (the demo's layer),
    for the ``captioner fit`` commands of :func:`tiny_fit_args`."""
    from captioner.features.extraction import extract_features
    from eval.demo.steps import ENCODER_LAYER

    out = tmp_path_factory.mktemp("features") / "features_resnet18.h5"
    extract_features(
        synthetic_data.karpathy_json, synthetic_data.image_root, out, arch="resnet18",
        layer=ENCODER_LAYER, weights=None, image_size=32, batch_size=8, num_workers=0,
        progress=False)
    return out


def tiny_fit_args(config: str, dataset, cache: Path, runs: Path) -> list[str]:
    """``captioner fit`` arguments (without the command name's ``fit``) of a small captioner
    of ``configs/CONFIG`` on ``dataset`` and its feature ``cache`` (:func:`cache32`), two
    training batches and one validation batch an epoch, its runs under ``runs``."""
    from data_prep.features import FeatureCache

    return [
        "--config", str(Path(__file__).resolve().parents[1] / "configs" / config),
        "--data.karpathy_json", str(dataset.karpathy_json),
        "--data.image_root", str(dataset.image_root),
        "--data.feature_cache", str(cache), "--data.image_size", "32",
        "--data.batch_size", "8", "--data.eval_batch_size", "4",
        "--model.encoder_weights", FeatureCache(cache).encoder["weights"],
        "--model.hidden_dim", "32", "--model.feature_dim", "32", "--model.embed_dim", "16",
        "--model.decoding.max_length", "8", "--model.decoding.beam_size", "2",
        "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1",
        "--trainer.enable_progress_bar", "false",
        "--trainer.logger.init_args.save_dir", str(runs),
    ]
